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
    Prefix(PrefixArgs),
    /// One escalation end to end: a corpus prefix pinned on the long-context model, a RAG
    /// answer on the base model over τ, and the long-context model answering over the pinned
    /// prefix; times the handoff (escalation decision to the long-context model's first token).
    Escalate(EscalateArgs),
    /// Aggregate decode tokens/s at each concurrency.
    Decode(DecodeArgs),
    /// Retrieval quality of every mode on a QA data set (needs `models fetch --data`), with
    /// ingestion throughput and hybrid query latency.
    Retrieval(RetrievalArgs),
    /// The routing pipeline on SQuAD v2 (needs `models fetch --data`): forced RAG, forced long
    /// context and auto per question over its article's first paragraphs; accuracy, tokens and
    /// time per path, and the AUROC of each uncertainty signal for a wrong RAG answer.
    Route(RouteArgs),
}

#[derive(clap::Args)]
pub struct PrefixArgs {
    #[arg(long)]
    pub model: String,
    #[arg(long, default_value_t = 2048)]
    pub prefix_tokens: usize,
    #[arg(long, default_value_t = 32)]
    pub question_tokens: usize,
    /// Write the cold prompt's token ids (a JSON array) here, for a peer to run the same
    /// prompt and compare its logits with the first token reported.
    #[arg(long)]
    pub prompt_ids: Option<std::path::PathBuf>,
    #[arg(long)]
    pub json: bool,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
}

#[derive(clap::Args)]
pub struct EscalateArgs {
    /// The base model (a default model's name, a GGUF file or a safetensors folder).
    #[arg(long)]
    pub model: String,
    /// The long-context model; may name the base model, which then plays both roles.
    #[arg(long)]
    pub lc_model: String,
    /// Tokens of the synthetic corpus prefix to pin.
    #[arg(long, default_value_t = 2048)]
    pub prefix_tokens: usize,
    /// The entropy threshold; 0 escalates any answer whose first tokens are not certain.
    #[arg(long, default_value_t = 0.0)]
    pub tau: f32,
    /// Tokens each answer may take.
    #[arg(long, default_value_t = 16)]
    pub answer_tokens: usize,
    #[arg(long)]
    pub json: bool,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
}

#[derive(clap::Args)]
pub struct DecodeArgs {
    #[arg(long)]
    pub model: String,
    /// Comma-separated concurrencies.
    #[arg(long, default_value = "1,4,16", value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: usize,
    #[arg(long)]
    pub json: bool,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
    /// Replay decode steps from captured graphs (CUDA graphs on a GPU; on the CPU the same
    /// path with the captured step run again, no faster).
    #[arg(long)]
    pub cuda_graphs: bool,
}

#[derive(clap::Args)]
pub struct RetrievalArgs {
    /// hotpotqa or squad.
    #[arg(long, default_value = "hotpotqa")]
    pub dataset: String,
    #[arg(long, default_value_t = 500)]
    pub questions: usize,
    /// The first N questions also run the LLM arms (reranking, dual-path): slow on CPU.
    #[arg(long, default_value_t = 0)]
    pub llm_questions: usize,
    #[arg(long, default_value = triage::DEFAULT_BASE_MODEL)]
    pub model: String,
    #[arg(long, default_value = triage::DEFAULT_EMBEDDER)]
    pub embedder: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct RouteArgs {
    #[arg(long, default_value_t = 100)]
    pub questions: usize,
    /// Paragraphs of each article in its corpus (8 ≈ 1.3k tokens).
    #[arg(long, default_value_t = 8)]
    pub paragraphs: usize,
    /// Questions taken from one article at most.
    #[arg(long, default_value_t = 12)]
    pub per_article: usize,
    #[arg(long, default_value = triage::DEFAULT_BASE_MODEL)]
    pub base: String,
    #[arg(long, default_value = "qwen2.5-coder-1.5b")]
    pub long_context: String,
    #[arg(long)]
    pub tau: Option<f32>,
    /// Fit the combined escalation score on these questions and freeze it to FILE (for
    /// `[routing.monitor] combined_score`).
    #[arg(long)]
    pub save_combined: Option<std::path::PathBuf>,
    /// Write one JSON line per question (the three answers with their decision records).
    #[arg(long)]
    pub rows: Option<std::path::PathBuf>,
    #[arg(long)]
    pub json: bool,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceSpec,
}

/// Run the benchmark asked for.
pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Prefix(args) => prefix(args),
        BenchCommand::Escalate(args) => escalate(args),
        BenchCommand::Decode(args) => decode(args),
        BenchCommand::Retrieval(args) => retrieval(args),
        BenchCommand::Route(args) => route(args),
    }
}

fn prefix(args: PrefixArgs) -> Result<()> {
    let model = load_model(&args.model, args.device)?;
    let r = triage_drivers::bench_prefix(
        &model,
        args.prefix_tokens,
        args.question_tokens,
        args.prompt_ids.as_deref(),
    )?;
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "prefix {} + question {} tokens: cold TTFT {:.1} ms, cached {:.1} ms, speedup {:.1}x",
            r.prefix_tokens, r.question_tokens, r.cold_ttft_ms, r.cached_ttft_ms, r.speedup
        );
    }
    Ok(())
}

fn escalate(args: EscalateArgs) -> Result<()> {
    let r = triage_drivers::bench_escalate(&EscalateBenchConfig {
        model: args.model,
        lc_model: args.lc_model,
        device: args.device,
        prefix_tokens: args.prefix_tokens,
        tau: args.tau,
        answer_tokens: args.answer_tokens,
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!("{}", escalate_summary(&r));
    }
    Ok(())
}

fn decode(args: DecodeArgs) -> Result<()> {
    let concurrency = &args.concurrency;
    if concurrency.is_empty() || concurrency.contains(&0) {
        anyhow::bail!("--concurrency takes positive integers, e.g. 1,4,16");
    }
    let model = load_model(&args.model, args.device)?;
    let results = triage_drivers::bench_decode(
        &model,
        concurrency,
        32,
        args.decode_tokens,
        args.cuda_graphs,
    )?;
    if args.json {
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

fn retrieval(args: RetrievalArgs) -> Result<()> {
    if args.questions == 0 {
        anyhow::bail!("--questions must be at least 1");
    }
    let r = triage_drivers::bench_retrieval(&RetrievalBenchConfig {
        dataset: args.dataset,
        questions: args.questions,
        llm_questions: args.llm_questions,
        model: args.model,
        embedder: args.embedder,
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", retrieval_markdown(&r));
    }
    Ok(())
}

fn route(args: RouteArgs) -> Result<()> {
    if args.questions == 0 || args.paragraphs == 0 || args.per_article == 0 {
        anyhow::bail!("--questions, --paragraphs and --per-article must be at least 1");
    }
    let config = RouteBenchConfig {
        questions: args.questions,
        paragraphs: args.paragraphs,
        per_article: args.per_article,
        base: args.base,
        long_context: args.long_context,
        tau: args.tau,
        save_combined: args.save_combined,
        rows: args.rows,
        device: args.device,
        squad: triage_fetch::data_file("squad.json")?,
        embedder: triage::DEFAULT_EMBEDDER.to_string(),
    };
    let r = triage_drivers::bench_route(&config)?;
    if args.json {
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
