//! `triage bench`: prefix caching, decode throughput, one escalation, retrieval quality and the
//! routing pipeline, each measured by its driver and printed here (a line, a table, or JSON).

use std::collections::BTreeMap;

use anyhow::Result;
use clap::Subcommand;
use serde_json::json;
use triage::DeviceSpec;
use triage_drivers::{
    EscalateBench, EscalateBenchConfig, RetrievalBench, RetrievalBenchConfig, RouteBenchConfig,
};

use super::load_model;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Time-to-first-token of a question after a shared prefix, cold vs cached.
    Prefix {
        #[arg(long)]
        model: String,
        #[arg(long, default_value_t = 2048)]
        prefix_tokens: usize,
        #[arg(long, default_value_t = 32)]
        question_tokens: usize,
        /// Write the cold prompt's token ids (a JSON array) here, for a peer to run the same
        /// prompt and compare its logits with the first token reported.
        #[arg(long)]
        prompt_ids: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
        /// `cpu`, `cuda` or `cuda:N`.
        #[arg(long, default_value = "cpu")]
        device: DeviceSpec,
    },
    /// One escalation end to end: a corpus prefix pinned on the long-context model, a RAG
    /// answer on the base model over τ, and the long-context model answering over the pinned
    /// prefix; times the handoff (escalation decision to the long-context model's first token).
    Escalate {
        /// The base model (a default model's name, a GGUF file or a safetensors folder).
        #[arg(long)]
        model: String,
        /// The long-context model; may name the base model, which then plays both roles.
        #[arg(long)]
        lc_model: String,
        /// Tokens of the synthetic corpus prefix to pin.
        #[arg(long, default_value_t = 2048)]
        prefix_tokens: usize,
        /// The entropy threshold; 0 escalates any answer whose first tokens are not certain.
        #[arg(long, default_value_t = 0.0)]
        tau: f32,
        /// Tokens each answer may take.
        #[arg(long, default_value_t = 16)]
        answer_tokens: usize,
        #[arg(long)]
        json: bool,
        /// `cpu`, `cuda` or `cuda:N`.
        #[arg(long, default_value = "cpu")]
        device: DeviceSpec,
    },
    /// Aggregate decode tokens/s at each concurrency.
    Decode {
        #[arg(long)]
        model: String,
        /// Comma-separated concurrencies.
        #[arg(long, default_value = "1,4,16", value_delimiter = ',')]
        concurrency: Vec<usize>,
        #[arg(long, default_value_t = 64)]
        decode_tokens: usize,
        #[arg(long)]
        json: bool,
        /// `cpu`, `cuda` or `cuda:N`.
        #[arg(long, default_value = "cpu")]
        device: DeviceSpec,
        /// Replay decode steps from captured graphs (CUDA graphs on a GPU; on the CPU the same
        /// path with the captured step run again, no faster).
        #[arg(long)]
        cuda_graphs: bool,
    },
    /// Retrieval quality of every mode on a QA data set (needs `models fetch --data`), with
    /// ingestion throughput and hybrid query latency.
    Retrieval {
        /// hotpotqa or squad.
        #[arg(long, default_value = "hotpotqa")]
        dataset: String,
        #[arg(long, default_value_t = 500)]
        questions: usize,
        /// The first N questions also run the LLM arms (reranking, dual-path): slow on CPU.
        #[arg(long, default_value_t = 0)]
        llm_questions: usize,
        #[arg(long, default_value = triage::DEFAULT_BASE_MODEL)]
        model: String,
        #[arg(long, default_value = triage::DEFAULT_EMBEDDER)]
        embedder: String,
        #[arg(long)]
        json: bool,
    },
    /// The routing pipeline on SQuAD v2 (needs `models fetch --data`): forced RAG, forced long
    /// context and auto per question over its article's first paragraphs; accuracy, tokens and
    /// time per path, and the AUROC of each uncertainty signal for a wrong RAG answer.
    Route {
        #[arg(long, default_value_t = 100)]
        questions: usize,
        /// Paragraphs of each article in its corpus (8 ≈ 1.3k tokens).
        #[arg(long, default_value_t = 8)]
        paragraphs: usize,
        /// Questions taken from one article at most.
        #[arg(long, default_value_t = 12)]
        per_article: usize,
        #[arg(long, default_value = triage::DEFAULT_BASE_MODEL)]
        base: String,
        #[arg(long, default_value = "qwen2.5-coder-1.5b")]
        long_context: String,
        #[arg(long)]
        tau: Option<f32>,
        /// Fit the combined escalation score on these questions and freeze it to FILE (for
        /// `[routing.monitor] combined_score`).
        #[arg(long)]
        save_combined: Option<std::path::PathBuf>,
        /// Write one JSON line per question (the three answers with their decision records).
        #[arg(long)]
        rows: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
        /// `cpu`, `cuda` or `cuda:N`.
        #[arg(long, default_value = "cpu")]
        device: DeviceSpec,
    },
}

/// Run the benchmark asked for.
pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Prefix {
            model,
            prefix_tokens,
            question_tokens,
            prompt_ids,
            json,
            device,
        } => {
            let model = load_model(&model, device)?;
            let r = triage_drivers::bench_prefix(
                &model,
                prefix_tokens,
                question_tokens,
                prompt_ids.as_deref(),
            )?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "prefix {} + question {} tokens: cold TTFT {:.1} ms, cached {:.1} ms, speedup {:.1}x",
                    r.prefix_tokens, r.question_tokens, r.cold_ttft_ms, r.cached_ttft_ms, r.speedup
                );
            }
            Ok(())
        }
        BenchCommand::Escalate {
            model,
            lc_model,
            prefix_tokens,
            tau,
            answer_tokens,
            json,
            device,
        } => escalate(
            &EscalateBenchConfig {
                model,
                lc_model,
                device,
                prefix_tokens,
                tau,
                answer_tokens,
            },
            json,
        ),
        BenchCommand::Decode {
            model,
            concurrency,
            decode_tokens,
            json,
            device,
            cuda_graphs,
        } => decode(
            &model,
            device,
            &concurrency,
            decode_tokens,
            cuda_graphs,
            json,
        ),
        BenchCommand::Retrieval {
            dataset,
            questions,
            llm_questions,
            model,
            embedder,
            json,
        } => retrieval(
            RetrievalBenchConfig {
                dataset,
                questions,
                llm_questions,
                model,
                embedder,
            },
            json,
        ),
        BenchCommand::Route {
            questions,
            paragraphs,
            per_article,
            base,
            long_context,
            tau,
            save_combined,
            rows,
            json,
            device,
        } => {
            if questions == 0 || paragraphs == 0 || per_article == 0 {
                anyhow::bail!("--questions, --paragraphs and --per-article must be at least 1");
            }
            let config = RouteBenchConfig {
                questions,
                paragraphs,
                per_article,
                base,
                long_context,
                tau,
                save_combined,
                rows,
                device,
                squad: triage_fetch::data_file("squad.json")?,
                embedder: triage::DEFAULT_EMBEDDER.to_string(),
            };
            route(&config, json)
        }
    }
}

fn escalate(config: &EscalateBenchConfig, json: bool) -> Result<()> {
    let r = triage_drivers::bench_escalate(config)?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!("{}", escalate_summary(&r));
    }
    Ok(())
}

fn decode(
    model: &str,
    device: DeviceSpec,
    concurrency: &[usize],
    decode_tokens: usize,
    cuda_graphs: bool,
    json: bool,
) -> Result<()> {
    if concurrency.is_empty() || concurrency.contains(&0) {
        anyhow::bail!("--concurrency takes positive integers, e.g. 1,4,16");
    }
    let model = load_model(model, device)?;
    let results =
        triage_drivers::bench_decode(&model, concurrency, 32, decode_tokens, cuda_graphs)?;
    if json {
        println!("{}", json!({ "results": results }));
    } else {
        for r in results {
            println!(
                "concurrency {:>3}: {:.1} tokens/s",
                r.concurrency, r.tokens_per_s
            );
        }
    }
    Ok(())
}

fn retrieval(config: RetrievalBenchConfig, json: bool) -> Result<()> {
    if config.questions == 0 {
        anyhow::bail!("--questions must be at least 1");
    }
    let r = triage_drivers::bench_retrieval(&config)?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", retrieval_markdown(&r));
    }
    Ok(())
}

fn route(config: &RouteBenchConfig, json: bool) -> Result<()> {
    let r = triage_drivers::bench_route(config)?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", triage_eval::route_analysis::markdown(&r));
    }
    Ok(())
}

/// The report as a Markdown table (one row per arm and question set).
fn retrieval_markdown(bench: &RetrievalBench) -> String {
    let mut out = format!(
        "{}: {} documents, {} chunks; ingest {:.1} s ({} chunks embedded, {:.1}/s); hybrid query \
         p50 {:.1} ms, p95 {:.1} ms over {} queries (embedding p50 {:.1} / p95 {:.1} ms, search \
         p50 {:.1} / p95 {:.1} ms)\n\n",
        bench.dataset,
        bench.documents,
        bench.chunks,
        bench.ingest_s,
        bench.chunks_embedded,
        bench.chunks_per_s,
        bench.hybrid_latency.p50_ms,
        bench.hybrid_latency.p95_ms,
        bench.hybrid_latency.queries,
        bench.embed_latency.p50_ms,
        bench.embed_latency.p95_ms,
        bench.search_latency.p50_ms,
        bench.search_latency.p95_ms,
    );
    out.push_str("| arm | questions | Hit@2 | Hit@5 | Hit@10 | R@2 | R@5 | R@10 | MRR |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for a in &bench.arms {
        let cell =
            |m: &BTreeMap<usize, f64>, k| format!("{:.3}", m.get(&k).copied().unwrap_or(0.0));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.3} |\n",
            a.arm,
            a.questions,
            cell(&a.hit, 2),
            cell(&a.hit, 5),
            cell(&a.hit, 10),
            cell(&a.recall, 2),
            cell(&a.recall, 5),
            cell(&a.recall, 10),
            a.mrr
        ));
    }
    out
}

/// The one-line summary printed without `--json`.
fn escalate_summary(r: &EscalateBench) -> String {
    let handoff = r
        .handoff_ms
        .map_or("no handoff".to_string(), |ms| format!("handoff {ms:.1} ms"));
    format!(
        "{} prefix tokens pinned in {:.0} ms; τ {} vs mean entropy {:.3}: escalated {} ({}); \
         {handoff}, {} prefix blocks reused, {} tokens prefilled on escalation",
        r.prefix_tokens,
        r.pin_ms,
        r.tau,
        r.mean_entropy,
        r.escalated,
        r.reason,
        r.prefix_blocks_reused,
        r.tokens_prefilled_on_escalation
    )
}
