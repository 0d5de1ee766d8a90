//! The `triage` command line: fetch and list models, generate text, serve the API, benchmark.
//! The only place that knows the command line; the commands themselves are in `cli/`.

mod cli;

use cli::args::*;

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::json;
use triage::DeviceSpec;
use triage::{ChatMessage, EntropySettings, GenerateRequest, Model, Prompt, SamplingParams};
use triage_fetch::{catalog, fetch, resolve_model, FetchOptions};

/// `TRIAGE_Q8_KERNEL` picks the int8 kernel for benchmarks; a name this CPU cannot run is an
/// error here rather than a silent fallback.
fn check_q8_kernel_override() -> Result<()> {
    let Ok(name) = std::env::var("TRIAGE_Q8_KERNEL") else {
        return Ok(());
    };
    if triage_ops::Q8Kernel::from_name(&name).is_some() {
        return Ok(());
    }
    let names: Vec<&str> = triage_ops::Q8Kernel::available()
        .iter()
        .map(|k| k.name())
        .collect();
    anyhow::bail!(
        "TRIAGE_Q8_KERNEL={name}: this CPU runs {}",
        names.join(", ")
    )
}

fn main() -> ExitCode {
    // Before any thread or model allocates: a prefill's per-op buffers are then reused, not
    // unmapped and faulted in again (`triage_ops::heap`).
    triage_ops::heap::retain_freed_memory();
    let cli = Cli::parse();
    init_logging(matches!(cli.command, Command::Serve(_)));
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(exit_code(&err))
        }
    }
}

/// The exit code of a failed command: the kind of the library error inside (2 for the
/// caller's mistakes, 3 for a missing corpus or model, 4 for a conflict, 5 for overload),
/// else 1.
fn exit_code(err: &anyhow::Error) -> u8 {
    err.chain()
        .find_map(triage::error_kind)
        .map_or(1, triage::ErrorKind::exit_code)
}

fn run(cli: Cli) -> Result<()> {
    check_q8_kernel_override()?;
    match cli.command {
        Command::Models {
            command: ModelsCommand::Fetch { data, names },
        } => models_fetch(data, names),
        Command::Models {
            command: ModelsCommand::List,
        } => models_list(),
        Command::Generate(args) => generate(args),
        Command::Serve(args) => cli::serve::serve(cli::serve::ServeOverrides {
            config: args.config,
            host: args.host,
            port: args.port,
            api_key: args.api_key,
            api_key_file: args.api_key_file,
            models: args.models,
            device: args.device,
            no_cuda_graphs: args.no_cuda_graphs,
        }),
        Command::Ingest(args) => ingest(args),
        Command::Retrieve(args) => retrieve(args),
        Command::Ask(args) => cli::ask::ask(&cli::ask::AskCommand {
            corpus: args.corpus,
            question: args.question,
            route: args.route.parse()?,
            tau: args.tau,
            max_tokens: args.max_tokens,
            config: args.engine.load()?,
            json: args.json,
        }),
        Command::Train { command } => train(command),
        Command::Eval(args) => eval(args),
        Command::Calibrate(args) => calibrate(args),
        Command::Signals(args) => signals(args),
        Command::Bench { command } => bench(command),
    }
}

fn eval_config(
    args: SuiteArgs,
    split: &str,
    out: std::path::PathBuf,
    systems: Vec<cli::eval::System>,
) -> Result<cli::eval::EvalConfig> {
    let config = args.engine.load()?;
    Ok(cli::eval::EvalConfig {
        suite: args.suite.parse()?,
        systems,
        out,
        limit: args.limit,
        seed: args.seed,
        split: split.parse()?,
        context_tokens: args.context_tokens,
        edar_classifier: cli::eval::default_edar_classifier(&config.routing),
        config,
        quiet: args.quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr()),
    })
}

fn eval(args: EvalArgs) -> Result<()> {
    let systems = cli::eval::parse_systems(&args.systems)?;
    if let Some(file) = args.export {
        let config = eval_config(args.suite, &args.split, file.clone(), systems)?;
        let questions = cli::eval::export(&config, &file)?;
        eprintln!("{questions} questions written to {}", file.display());
        return Ok(());
    }
    let out = args.out.context("--out names the run directory")?;
    let config = eval_config(args.suite, &args.split, out, systems)?;
    let report = cli::eval::run(&config)?.report;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", triage_eval::report::markdown(&report));
        eprintln!("written to {}", config.out.display());
    }
    Ok(())
}

fn signals(args: SignalsArgs) -> Result<()> {
    use triage_eval::signal_study;
    let load = |dirs: &[std::path::PathBuf]| -> Result<Vec<signal_study::Labelled>> {
        let mut out = Vec::new();
        for dir in dirs {
            if !dir.join("results.jsonl").exists() {
                anyhow::bail!("{} holds no results.jsonl", dir.display());
            }
            let file = triage_eval::ResultsFile::open(dir)?;
            if let Some(r) = file
                .rows()
                .iter()
                .find(|r| r.split != triage_eval::suites::Split::Dev)
            {
                if args.train.contains(dir) {
                    anyhow::bail!(
                        "{} is a {} run: fit on dev runs only",
                        dir.display(),
                        r.split.as_str()
                    );
                }
            }
            out.extend(signal_study::labelled(file.rows()));
        }
        Ok(out)
    };
    let (train, test) = (load(&args.train)?, load(&args.test)?);
    if train.is_empty() || (test.is_empty() && !args.test.is_empty()) {
        anyhow::bail!("no monitored RAG answers to study (run triage eval with the rag system)");
    }
    let study = if args.test.is_empty() {
        signal_study::leave_one_corpus_out(&train)?.with_context(|| {
            "the train runs hold one corpus, so none can be held out: pass --test runs"
        })?
    } else {
        let mut study = signal_study::study(&train, &test)?;
        study.probe_routing =
            signal_study::probe_routing(&train, &test, args.probe_false_escalation)?;
        study
    };
    if let Some(path) = &args.save_combined {
        let model_id = args
            .train
            .iter()
            .find_map(|d| {
                let file = triage_eval::ResultsFile::open(d).ok()?;
                let m = file
                    .rows()
                    .iter()
                    .find_map(|r| r.decision.monitor.clone())?;
                Some(m.tau.model)
            })
            .unwrap_or_default();
        let x: Vec<Vec<f32>> = train.iter().map(|l| l.inputs.clone()).collect();
        let y: Vec<bool> = train.iter().map(|l| l.wrong).collect();
        let hash = triage_policy::CombinedScore::fit(&model_id, &x, &y, 0.5)?.save(path)?;
        eprintln!("combined score saved to {} (sha256 {hash})", path.display());
    }
    if let (Some(path), Some(layer)) = (&args.save_probe, args.probe_layer) {
        save_probe(&args.train, layer, args.probe_false_escalation, path)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&study)?);
    } else {
        print!("{}", signal_study::markdown(&study));
    }
    Ok(())
}

/// Fits the probe at `layer` on the train runs' recorded last-prompt-token states.
fn save_probe(
    train: &[std::path::PathBuf],
    layer: usize,
    max_false_escalation: f64,
    path: &std::path::Path,
) -> Result<()> {
    let mut model_id = String::new();
    let mut rows: Vec<(Vec<f32>, bool)> = Vec::new();
    for dir in train {
        let file = triage_eval::ResultsFile::open(dir)?;
        for r in file.rows() {
            let Some(m) = r.decision.monitor.as_ref() else {
                continue;
            };
            let Some(p) = m.probe.as_ref() else { continue };
            if let Some(at) = p.layers.iter().position(|&l| l == layer) {
                model_id.clone_from(&m.tau.model);
                rows.push((p.prompt[at].clone(), !r.score.correct));
            }
        }
    }
    if rows.is_empty() {
        anyhow::bail!(
            "no train answer recorded layer {layer}: run triage eval with              [routing.monitor] probe_layers including it"
        );
    }
    let refs: Vec<(&[f32], bool)> = rows.iter().map(|(s, w)| (s.as_slice(), *w)).collect();
    let probe = triage_policy::ProbeModel::fit(&model_id, layer, &refs, max_false_escalation)?;
    let hash = probe.save(path)?;
    eprintln!(
        "probe at layer {layer} saved to {} (threshold {:.4}, fitted on {} answers; sha256 {hash})",
        path.display(),
        probe.threshold,
        rows.len()
    );
    Ok(())
}

fn calibrate(args: CalibrateArgs) -> Result<()> {
    let runs = args.runs.clone().unwrap_or_else(|| {
        triage_models::paths::triage_home()
            .join("eval")
            .join(format!(
                "calibrate-{}-s{}-c{}",
                args.suite.suite, args.suite.seed, args.suite.context_tokens
            ))
    });
    use triage_eval::calibrate::{Floor, Rule};
    let floor = match (args.min_accuracy, args.min_retained) {
        (Some(a), _) => Floor::Accuracy(a),
        (None, Some(f)) => Floor::Retained(f),
        (None, None) => Floor::None,
    };
    let rule = match (args.escalation_rate, args.cheapest) {
        (Some(rate), _) => Rule::EscalationRate(rate),
        (None, true) => Rule::Cheapest(floor),
        (None, false) => Rule::Elbow(floor),
    };
    let config = eval_config(args.suite, &args.split, runs, Vec::new())?;
    let options = cli::calibrate::CalibrateOptions {
        combined_fit: args.combined_fit.clone(),
        combined_apart: args.combined_apart,
        choose_self_route: args.choose_self_route,
        ..cli::calibrate::CalibrateOptions::tau(rule)
    };
    let calibrated = cli::calibrate::calibrate(&config, &args.out, &options)?;
    let (chosen, calibration) = (&calibrated.chosen, &calibrated.calibration);
    let statistic = if calibrated.combined.is_some() {
        "P(wrong) thresholds"
    } else {
        "τs"
    };
    println!(
        "{} quantile {statistic} on dev; every 5% of escalation:\n\n| threshold | escalated | accuracy | tokens | cost |\n|---|---|---|---|---|",
        chosen.curve.len()
    );
    for p in &triage_eval::by_escalation_rate(&chosen.curve, 20) {
        println!(
            "| {:.4} | {:.2} | {:.3} | {:.0} | {:.5} |",
            p.tau, p.escalation_rate, p.accuracy, p.mean_tokens, p.mean_cost
        );
    }
    let decides = match &calibrated.combined {
        Some(c) => format!(
            "the combined score (fitted on {} dev answers, {} left out as calibration \
             questions; sha256 {}) escalates at P(wrong) ≥ {:.4}; saved to {}",
            c.fit_answers,
            c.left_out,
            c.sha256,
            c.threshold,
            c.path.display()
        ),
        None => format!("τ = {}", chosen.tau),
    };
    println!(
        "\n{decides} ({}): accuracy {:.3} (rag {:.3}, lc {:.3}), {:.1}% escalated, {:.1}% of LC's \
         accuracy at {:.1}% of its tokens; written to {}",
        calibration.rule,
        calibration.accuracy,
        calibration.rag_accuracy,
        calibration.lc_accuracy,
        100.0 * calibration.escalation_rate,
        100.0 * calibration.accuracy_retained,
        100.0 * (1.0 - calibration.token_reduction),
        args.out.display()
    );
    if let Some(other) = &calibrated.other {
        let offer = |on: bool| if on { "with" } else { "without" };
        let how = match &other.point {
            Ok(p) => format!(
                "accuracy {:.3} at {:.0} mean tokens, {:.1}% escalated",
                p.accuracy,
                p.mean_tokens,
                100.0 * p.escalation_rate
            ),
            Err(e) => format!("no operating point ({e})"),
        };
        println!(
            "self_route = {}: forced RAG {} the decline offer did better than {} it ({how})",
            calibrated.self_route,
            offer(calibrated.self_route),
            offer(other.self_route)
        );
    }
    Ok(())
}

fn train(command: TrainCommand) -> Result<()> {
    match command {
        TrainCommand::Classifier {
            data,
            out,
            embedder,
            zero_shot_model,
            json,
        } => {
            let r = cli::train::train_classifier(
                &data,
                out.as_deref(),
                &embedder,
                zero_shot_model.as_deref(),
            )?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                let auroc = |a: Option<f64>| a.map_or("n/a".into(), |a| format!("{a:.3}"));
                println!(
                    "learned classifier: held-out accuracy {:.3}, AUROC {} on {} rows ({} groups); \
                     trained on {} rows",
                    r.learned.accuracy,
                    auroc(r.learned.auroc),
                    r.held_out_rows,
                    r.held_out_groups,
                    r.train_rows
                );
                if let (Some(z), Some(m)) = (r.zero_shot, &r.zero_shot_model) {
                    println!(
                        "zero-shot ({m}): held-out accuracy {:.3}, AUROC {}",
                        z.accuracy,
                        auroc(z.auroc)
                    );
                }
                if let (Some(t), Some(z)) = (r.zero_shot_threshold, r.zero_shot_calibrated) {
                    println!(
                        "zero-shot with its threshold calibrated on the training rows \
                         (P(global) >= {t:.4}; routing: classifier = {{ zero_shot_threshold = \
                         {t:.4} }}): held-out accuracy {:.3}",
                        z.accuracy
                    );
                }
                println!("saved {} (sha256 {})", r.path.display(), r.sha256);
            }
        }
        TrainCommand::GainPolicy {
            dataset,
            questions,
            out,
            json,
        } => {
            let r = cli::train::train_gain_policy(&dataset, questions, out.as_deref())?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                let cv = &r.cross_validation;
                println!(
                    "gain policy on {} {} questions ({} held out): tau_h = {:.4}",
                    cv.num_examples, r.dataset, r.held_out_questions, r.tau_h
                );
                println!(
                    "cross-validated Hit@10: dense {:.3}, hybrid {:.3}, policy {:.3} at a hybrid \
                     rate of {:.3}; objective policy {:.3} vs always-hybrid {:.3}",
                    cv.hit_dense_always,
                    cv.hit_hybrid_always,
                    cv.hit_policy,
                    cv.hybrid_rate,
                    cv.objective_policy,
                    cv.objective_hybrid_always
                );
                println!("saved {} (sha256 {})", r.path.display(), r.sha256);
            }
        }
    }
    Ok(())
}

fn ingest(args: IngestArgs) -> Result<()> {
    let chunker = triage_retrieval::ChunkerConfig {
        max_tokens: args.chunk_tokens,
        overlap_tokens: args.overlap_tokens,
    };
    let report = cli::retrieve::ingest(
        &args.corpus,
        &args.paths,
        &args.delete,
        &args.embedder,
        chunker,
    )?;
    let milvus = match &args.milvus {
        Some(uri) => Some(cli::retrieve::sync_milvus(&args.corpus, uri)?),
        None => None,
    };
    if args.json {
        let mut out = serde_json::to_value(&report)?;
        if let Some(m) = milvus {
            out["milvus"] = json!({"inserted": m.inserted, "deleted": m.deleted, "total": m.total});
        }
        println!("{out}");
    } else {
        if let Some(m) = milvus {
            println!(
                "milvus: {} inserted, {} deleted, {} in all",
                m.inserted, m.deleted, m.total
            );
        }
        println!(
            "{}: {} added, {} updated, {} unchanged, {} deleted; {} chunks embedded, {} in all",
            args.corpus,
            report.added,
            report.updated,
            report.unchanged,
            report.deleted,
            report.chunks_embedded,
            report.chunks_total
        );
    }
    Ok(())
}

fn retrieve(args: RetrieveArgs) -> Result<()> {
    use triage_router::{RetrieveMode, RetrieveParams};
    let mode = match args.mode {
        Mode::Dense => RetrieveMode::Dense,
        Mode::Bm25 => RetrieveMode::Bm25,
        Mode::Hybrid => RetrieveMode::Hybrid,
        Mode::Dual => RetrieveMode::Dual,
    };
    let out = cli::retrieve::retrieve(&cli::retrieve::RetrieveCommand {
        corpus: args.corpus,
        query: args.query,
        params: RetrieveParams {
            mode,
            k: args.k,
            candidates: args.candidates,
            ..RetrieveParams::default()
        },
        embedder: args.embedder,
        rerank: args.rerank,
        cross_encoder: args.cross_encoder,
        model: args.model,
        milvus: args.milvus,
    })?;
    if args.json {
        println!("{out}");
        return Ok(());
    }
    if let Some(passage) = out["pseudo_passage"].as_str() {
        println!("pseudo-passage: {}", passage.replace('\n', " "));
    }
    for hit in out["hits"].as_array().into_iter().flatten() {
        let text: String = hit["text"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(100)
            .collect();
        println!(
            "{:>2}. {:.4}  {}  {}",
            hit["rank"],
            hit["score"].as_f64().unwrap_or(0.0),
            hit["document"].as_str().unwrap_or(""),
            text.replace('\n', " ")
        );
    }
    Ok(())
}

/// Logs to stderr; `RUST_LOG` filters (default: info for the server, warnings for the other
/// commands, whose output is their result).
fn init_logging(server: bool) {
    let default = if server { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

fn load(name_or_path: &str, device: DeviceSpec) -> Result<std::sync::Arc<Model>> {
    Ok(std::sync::Arc::new(triage::load_model(
        name_or_path,
        device,
    )?))
}

fn bench(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Prefix {
            model,
            prefix_tokens,
            question_tokens,
            prompt_ids,
            json,
            device,
        } => {
            let model = load(&model, device)?;
            let r = cli::bench::prefix(
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
        }
        BenchCommand::Escalate {
            model,
            lc_model,
            prefix_tokens,
            tau,
            answer_tokens,
            json,
            device,
        } => {
            let r = cli::bench_escalate::run(&cli::bench_escalate::EscalateBenchConfig {
                model,
                lc_model,
                device,
                prefix_tokens,
                tau,
                answer_tokens,
            })?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!("{}", cli::bench_escalate::summary(&r));
            }
        }
        BenchCommand::Decode {
            model,
            concurrency,
            decode_tokens,
            json,
            device,
            cuda_graphs,
        } => {
            if concurrency.is_empty() || concurrency.contains(&0) {
                anyhow::bail!("--concurrency takes positive integers, e.g. 1,4,16");
            }
            let model = load(&model, device)?;
            let results = cli::bench::decode(&model, &concurrency, 32, decode_tokens, cuda_graphs)?;
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
        }
        BenchCommand::Retrieval {
            dataset,
            questions,
            llm_questions,
            model,
            embedder,
            json,
        } => {
            if questions == 0 {
                anyhow::bail!("--questions must be at least 1");
            }
            let config = cli::bench_retrieval::RetrievalBenchConfig {
                dataset,
                questions,
                llm_questions,
                model,
                embedder,
            };
            let r = cli::bench_retrieval::run(&config)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print!("{}", cli::bench_retrieval::markdown(&r));
            }
        }
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
            let config = cli::bench_route::RouteBenchConfig {
                questions,
                paragraphs,
                per_article,
                base,
                long_context,
                tau,
                save_combined,
                rows,
                device,
            };
            let r = cli::bench_route::run(&config)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print!("{}", cli::bench_route::markdown(&r));
            }
        }
    }
    Ok(())
}

fn models_fetch(data: bool, names: Vec<String>) -> Result<()> {
    let opts = FetchOptions {
        names,
        include_data: data,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        ..Default::default()
    };
    for outcome in fetch(&opts)? {
        for file in &outcome.files {
            println!(
                "{:<22} {:?} {} ({} bytes)",
                outcome.name,
                outcome.status,
                file.path.display(),
                file.size
            );
        }
    }
    Ok(())
}

fn models_list() -> Result<()> {
    println!(
        "{:<22} {:<8} {:>8} {:>8}  {:<40} PATH",
        "NAME", "ARCH", "PARAMS", "CONTEXT", "QUANTIZATION"
    );
    for entry in catalog::CATALOG.iter().filter(|e| !e.is_data()) {
        match resolve_model(entry.name) {
            Ok((_, path)) if path.is_file() => {
                let info = triage_models::GgufInfo::read(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                println!(
                    "{:<22} {:<8} {:>7.0}M {:>8}  {:<40} {}",
                    entry.name,
                    info.architecture.as_deref().unwrap_or("?"),
                    info.num_params as f64 / 1e6,
                    info.context_length
                        .map_or("?".to_string(), |c| c.to_string()),
                    info.quantization_summary(),
                    path.display()
                );
            }
            Ok((_, path)) => println!(
                "{:<22} {:<8} {:>8} {:>8}  {:<40} {}",
                entry.name,
                "bert",
                "-",
                "-",
                "safetensors",
                path.display()
            ),
            Err(_) => println!(
                "{:<22} (not fetched: run `triage models fetch`)",
                entry.name
            ),
        }
    }
    Ok(())
}

fn generate(args: GenerateArgs) -> Result<()> {
    let load_start = std::time::Instant::now();
    let model = load(&args.model, args.device)?;
    let load_ms = load_start.elapsed().as_secs_f64() * 1e3;
    let prompt = match (args.prompt, args.chat) {
        (Some(text), _) => Prompt::Text(text),
        (None, Some(chat)) => Prompt::Chat(vec![ChatMessage::user(chat)]),
        (None, None) => anyhow::bail!("give --prompt or --chat"),
    };
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
        max_tokens: Some(args.max_tokens),
        ignore_eos: args.ignore_eos,
        ..Default::default()
    };
    let request = GenerateRequest {
        prompt,
        params,
        entropy: EntropySettings::default(),
    };
    let stream = !args.json;
    let mut stdout = std::io::stdout().lock();
    let output = triage::generate(&model, &request, |_, piece| {
        if stream {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
        true
    })?;
    if args.json {
        let tokens: Vec<_> = output
            .tokens
            .iter()
            .map(
                |t| json!({"id": t.id, "text": t.text, "logprob": t.logprob, "entropy": t.entropy}),
            )
            .collect();
        let value = json!({
            "text": output.text,
            "prompt_tokens": output.prompt_tokens,
            "completion_tokens": output.completion_tokens,
            "finish_reason": output.finish_reason,
            "tokens": tokens,
            "mean_entropy": output.mean_entropy,
            "timings": output.timings,
            "load_ms": load_ms,
        });
        writeln!(stdout, "{value}")?;
    } else {
        writeln!(stdout)?;
    }
    Ok(())
}
