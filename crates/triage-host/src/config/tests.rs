//! The config file: the server's and the library's spellings, old ones with their warnings.

use super::*;
use triage_router::RoutePath;
use triage_router::{RagSearch, RerankSetting};

fn name_of(c: &TriageConfig, role: ModelRole) -> &str {
    &c.model(role).expect("a model plays every role").name
}

/// The `[routing]` table as the README documents it, in the library's earlier file.
#[test]
fn the_documented_config_parses() {
    let text = r#"
corpora = ["docs"]

[models]
long_context = "qwen2.5-coder-0.5b"

[routing]
classifier = { learned = "/tmp/classifier.json" }
gate_nll = 0.2
actions = ["none", "rag", "hybrid", "lc"]
abstain = true

[routing.retrieval]
search = "dual"
rerank = "llm"
k = 4
gain_policy = "/tmp/gain.json"

[routing.monitor]
tau = 0.6
window = 30
estimator = "full_softmax"
self_route = true
combined_score = "/tmp/combined.json"

[routing.prices.long_context]
prompt = 3.0
cached_prompt = 0.75
completion = 9.0
"#;
    let c = TriageConfig::from_toml_str(text).unwrap();
    assert_eq!(c.pipeline.corpora, ["docs"]);
    assert_eq!(name_of(&c, ModelRole::LongContext), "qwen2.5-coder-0.5b");
    assert_eq!(name_of(&c, ModelRole::Base), "qwen2.5-coder-0.5b");
    let r = &c.routing;
    assert_eq!(
        r.classifier,
        ClassifierSetting::Learned("/tmp/classifier.json".into())
    );
    assert_eq!(r.gate_nll, Some(0.2));
    assert_eq!(r.actions.len(), 4);
    assert!(r.abstain);
    assert_eq!(r.retrieval.search, RagSearch::Dual);
    assert_eq!(r.retrieval.rerank, RerankSetting::Llm);
    assert_eq!(r.monitor.tau, 0.6);
    assert_eq!(r.prices.long_context.cached_prompt, 0.75);
    assert!(r.allows(RoutePath::Hybrid));
    for (form, expected) in [
        ("\"zero_shot\"", ClassifierSetting::ZeroShot),
        (
            "{ zero_shot_threshold = 0.19 }",
            ClassifierSetting::ZeroShotThreshold(0.19),
        ),
        ("\"off\"", ClassifierSetting::Off),
    ] {
        let c = TriageConfig::from_toml_str(&format!("[routing]\nclassifier = {form}\n")).unwrap();
        assert_eq!(c.routing.classifier, expected);
    }
    assert!(TriageConfig::from_toml_str("[routing]\nclassifier = \"psychic\"\n").is_err());
    assert!(TriageConfig::from_toml_str("[models]\nbase = 3\n").is_err());
}

#[test]
fn old_spellings_load_with_a_warning_each() {
    let c = TriageConfig::from_toml_str(
        "corpora = [\"a\"]\nprefix_dir = \"/p\"\n[models]\nembedder = \"/e\"\nkv_budget = \"64blocks\"\n",
    )
    .unwrap();
    assert_eq!(c.deprecated.len(), 4, "{:?}", c.deprecated);
    assert_eq!(c.pipeline.corpora, ["a"]);
    assert_eq!(c.pipeline.prefix_dir.as_deref(), Some(Path::new("/p")));
    assert_eq!(c.pipeline.embedder, "/e");
    assert!(c.models.iter().all(|m| m.kv_budget == "64blocks"));
    // The same settings in today's spelling warn about nothing.
    let c = TriageConfig::from_toml_str(
        "[pipeline]\ncorpora = [\"a\"]\nprefix_dir = \"/p\"\nembedder = \"/e\"\n[[models]]\nname = \"m\"\n",
    )
    .unwrap();
    assert!(c.deprecated.is_empty());
    assert_eq!(c.pipeline.corpora, ["a"]);
    // Both spellings of the long-context role are read.
    for spelling in ["long-context", "long_context"] {
        let c = TriageConfig::from_toml_str(&format!(
            "[[models]]\nname = \"a\"\n[[models]]\nname = \"b\"\nrole = \"{spelling}\"\n"
        ))
        .unwrap();
        assert_eq!(name_of(&c, ModelRole::LongContext), "b");
    }
    let err = TriageConfig::from_toml_str("[[models]]\nname = \"a\"\nrole = \"chef\"\n");
    assert!(err.unwrap_err().to_string().contains("chef"));
}

#[test]
fn roles_fall_back_to_the_base_model_and_the_router_loads_only_when_needed() {
    let mut c = TriageConfig::from_toml_str("[[models]]\nname = \"only\"\n").unwrap();
    for role in ModelRole::ALL {
        assert_eq!(name_of(&c, role), "only");
    }
    let defaults = TriageConfig::default();
    assert!(defaults
        .models_to_load()
        .all(|m| m.role != ModelRole::Router));
    c = defaults.clone();
    c.routing.classifier = ClassifierSetting::ZeroShot;
    assert!(c.models_to_load().any(|m| m.role == ModelRole::Router));
    // Overriding a role with another role's model shares that model's entry.
    let mut c = TriageConfig::default();
    c.set_model(ModelRole::Base, "/m.gguf").unwrap();
    c.set_model(ModelRole::LongContext, "/m.gguf").unwrap();
    assert_eq!(name_of(&c, ModelRole::Base), "/m.gguf");
    assert_eq!(name_of(&c, ModelRole::LongContext), "/m.gguf");
    assert_eq!(c.models.iter().filter(|m| m.spec() == "/m.gguf").count(), 1);
    c.validate().unwrap();
    // The router's model cannot also be the long-context model (an entry plays one role):
    // refused, and nothing changed, where the role used to fall back to the base model.
    let mut c = TriageConfig::default();
    let router = name_of(&c, ModelRole::Router).to_string();
    let before = c.models.clone();
    let err = c
        .set_model(ModelRole::LongContext, &router)
        .unwrap_err()
        .to_string();
    assert!(err.contains("router role"), "{err}");
    assert_eq!(c.models, before);
    // As the base model it may: it then plays every role no other entry plays.
    c.set_model(ModelRole::Base, &router).unwrap();
    assert_eq!(name_of(&c, ModelRole::Router), router);
    assert_eq!(name_of(&c, ModelRole::Base), router);
}

#[test]
fn models_take_a_device_and_a_kv_dtype() {
    let c =
        TriageConfig::from_toml_str("[models]\ndevice = \"cuda:1\"\nkv_dtype = \"f32\"\n").unwrap();
    let base = c.model(ModelRole::Base).unwrap();
    assert_eq!(base.device, DeviceSpec::Cuda(1));
    assert_eq!(base.kv_dtype.as_deref(), Some("f32"));
    assert!(TriageConfig::default()
        .models
        .iter()
        .all(|m| m.device == DeviceSpec::Cpu));
    let err = TriageConfig::from_toml_str("[models]\ndevice = \"tpu\"\n").unwrap_err();
    assert!(err.to_string().contains("cuda:N"), "{err}");
}

#[test]
fn cuda_graphs_are_off_by_default_gpu_only_and_can_be_forced_off() {
    let entries = "[[models]]\nname = \"g\"\ndevice = \"cuda:0\"\ncuda_graphs = true\n\
                   [[models]]\nname = \"c\"\ncuda_graphs = true\n\
                   [[models]]\nname = \"d\"\ndevice = \"cuda:0\"\n";
    let mut c = TriageConfig::from_toml_str(entries).unwrap();
    let graphs = |c: &TriageConfig| -> Vec<bool> {
        c.models
            .iter()
            .map(|m| m.engine_config().unwrap().cuda_graphs)
            .collect()
    };
    // On for the GPU entry that asks; the CPU entry's request is ignored; off by default.
    assert_eq!(graphs(&c), [true, false, false]);
    c.disable_cuda_graphs();
    assert_eq!(graphs(&c), [false, false, false]);
    assert!(!TriageConfig::default().models[0].cuda_graphs);
}

#[test]
fn a_config_file_overrides_defaults_per_model() {
    let config = TriageConfig::from_toml_str(
        r#"
        port = 9000
        api_key = "secret"
        [[models]]
        name = "small"
        path = "/models/small.gguf"
        kv_budget = "256MiB"
        [[models]]
        name = "big"
        role = "long-context"
        kv_budget = "0.25"
        max_num_seqs = 8
        "#,
    )
    .unwrap();
    assert_eq!(config.server.port, 9000);
    assert_eq!(
        config.server.host, "127.0.0.1",
        "loopback unless told otherwise"
    );
    assert_eq!(config.models.len(), 2);
    assert_eq!(config.models[0].role, ModelRole::Base);
    assert_eq!(
        config.models[1].engine_config().unwrap().kv_budget,
        KvBudget::Fraction(0.25)
    );
    assert_eq!(config.models[1].engine_config().unwrap().max_num_seqs, 8);
}

#[test]
fn mistakes_in_the_file_are_errors() {
    for bad in [
        "prot = 1",
        "[[models]]\nname = \"a\"\nkv_budget = \"lots\"",
        "[[models]]\nname = \"a\"\n[[models]]\nname = \"a\"",
        "models = []",
        "api_key = \"\"",
        "port = -1",
        "models = 3",
        "[pipeline]\nprefix_store = \"gs://bucket\"",
        "[pipeline]\nprefix_store = \"s3://\"",
    ] {
        assert!(
            TriageConfig::from_toml_str(bad).is_err(),
            "{bad:?} accepted"
        );
    }
    let defaults = TriageConfig::from_toml_str("").unwrap();
    assert_eq!(defaults, TriageConfig::default());
    // Routing settings are checked when a pipeline is built (or the whole file validated).
    let bad_tau = TriageConfig::from_toml_str("[routing.monitor]\ntau = -2.0\n").unwrap();
    assert!(bad_tau.validate().is_err());
}

#[test]
fn replicas_share_a_data_dir_and_an_s3_prefix_store() {
    let c = TriageConfig::from_toml_str(
        "[pipeline]\ndata_dir = \"/shared/triage\"\nprefix_store = \"s3://bucket/prefixes\"\n",
    )
    .unwrap();
    assert_eq!(c.pipeline.data_dir(), Path::new("/shared/triage"));
    assert_eq!(
        c.pipeline.prefix_store.as_deref(),
        Some("s3://bucket/prefixes")
    );
    let remote = c.pipeline.prefix_remote().unwrap().unwrap();
    assert!(format!("{remote:?}").contains("s3://bucket/prefixes"));
    // Without one, prefixes stay in the local folder only.
    let local = TriageConfig::default();
    assert!(local.pipeline.prefix_remote().unwrap().is_none());
    assert_eq!(
        local.pipeline.data_dir(),
        triage_models::paths::triage_home()
    );
}

#[test]
fn the_readme_example_parses() {
    let readme = include_str!("../../../../README.md");
    let start = readme
        .find("```toml\n")
        .expect("a toml block in the README")
        + 8;
    let end = start + readme[start..].find("```").expect("closed block");
    let config = TriageConfig::from_toml_str(&readme[start..end]).unwrap();
    assert!(config.deprecated.is_empty(), "{:?}", config.deprecated);
    assert_eq!(config.server.api_key.as_deref(), Some("sk-local"));
    let server = &config.server;
    assert_eq!(
        (
            server.header_timeout_s,
            server.body_timeout_s,
            server.max_connections
        ),
        (30, 60, 1024)
    );
    assert_eq!(config.models.len(), 2);
    assert_eq!(config.models[0].device, DeviceSpec::Cpu);
    let engine = config.models[0].engine_config().unwrap();
    assert_eq!(engine.kv_dtype, Some(candle_core::DType::F16));
    // The second entry leaves both to the device's defaults.
    assert_eq!(config.models[1].kv_dtype, None);
    let gpu = TriageConfig::from_toml_str(
        "[[models]]\nname = \"m\"\ndevice = \"cuda:2\"\nkv_dtype = \"bf16\"\n",
    )
    .unwrap();
    assert_eq!(gpu.models[0].device, DeviceSpec::Cuda(2));
    let bad = TriageConfig::from_toml_str("[[models]]\nname = \"m\"\nkv_dtype = \"int4\"\n");
    assert!(bad.unwrap_err().to_string().contains("int4"));
    // The pipeline's block, limits included, is the defaults written out.
    let pipeline = readme
        .split("```toml\n")
        .map(|b| &b[..b.find("```").unwrap_or(b.len())])
        .find(|b| b.contains("[pipeline.limits]"))
        .expect("the pipeline block");
    let config = TriageConfig::from_toml_str(pipeline).unwrap();
    assert_eq!(
        config.pipeline.limits,
        crate::config::CorpusLimits::default()
    );
}

#[test]
fn the_api_key_comes_from_a_file_and_an_open_bind_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key");
    std::fs::write(&file, "sk-file\n").unwrap();
    let text = format!("api_key_file = {:?}\n", file.display().to_string());
    let c = TriageConfig::from_toml_str(&text).unwrap();
    assert_eq!(c.server.api_key.as_deref(), Some("sk-file"));
    let both = format!("api_key = \"x\"\n{text}");
    assert!(TriageConfig::from_toml_str(&both).is_err());
    std::fs::write(&file, "\n").unwrap();
    assert!(TriageConfig::from_toml_str(&text).is_err());
    let mut server = ServerSettings::default();
    assert_eq!(server.exposure_warning(), None);
    server.host = "0.0.0.0".into();
    assert!(server.exposure_warning().unwrap().contains("0.0.0.0"));
    server.api_key = Some("k".into());
    assert_eq!(server.exposure_warning(), None);
}

#[test]
fn a_loopback_server_answers_only_to_loopback_names() {
    let mut s = ServerSettings::default();
    for ok in [
        "127.0.0.1:8080",
        "localhost",
        "LOCALHOST:1",
        "[::1]:8080",
        "127.0.0.2",
    ] {
        assert!(s.allows_host(ok), "{ok}");
    }
    for bad in ["evil.example:8080", "x", "10.0.0.1", "[::2]:80"] {
        assert!(!s.allows_host(bad), "{bad}");
    }
    s.allowed_hosts = vec!["gpu-box".into()];
    assert!(s.allows_host("gpu-box:8080") && !s.allows_host("evil.example"));
    s.host = "0.0.0.0".into();
    assert!(s.allows_host("gpu-box") && !s.allows_host("evil.example"));
    s.allowed_hosts.clear();
    assert!(s.allows_host("anything:1"));
}

/// The README's set of Hub models for one GPU node: short served names over Hub ids, one per
/// role, each on the GPU.
#[test]
fn the_readme_hub_models_config_parses() {
    let readme = include_str!("../../../../README.md");
    let section = &readme[readme
        .find("### A set for one GPU node")
        .expect("the README's GPU-node section")..];
    let start = section.find("```toml\n").expect("its toml block") + 8;
    let end = start + section[start..].find("```").expect("closed block");
    let config = TriageConfig::from_toml_str(&section[start..end]).unwrap();
    assert!(config.deprecated.is_empty(), "{:?}", config.deprecated);
    let entries: Vec<(&str, Option<&str>, DeviceSpec)> = config
        .models
        .iter()
        .map(|m| (m.name.as_str(), m.path.as_deref(), m.device))
        .collect();
    assert_eq!(
        entries,
        [
            ("qwen3-0.6b", Some("Qwen/Qwen3-0.6B"), DeviceSpec::Cuda(0)),
            ("qwen3-8b", Some("Qwen/Qwen3-8B"), DeviceSpec::Cuda(0)),
            (
                "llama-3.1-8b",
                Some("meta-llama/Llama-3.1-8B-Instruct"),
                DeviceSpec::Cuda(0)
            ),
        ]
    );
    assert_eq!(name_of(&config, ModelRole::Router), "qwen3-0.6b");
    assert_eq!(name_of(&config, ModelRole::Base), "qwen3-8b");
    assert_eq!(name_of(&config, ModelRole::LongContext), "llama-3.1-8b");
}
