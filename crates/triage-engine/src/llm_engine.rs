//! `LlmEngine`: continuous batching over the paged KV cache. Each `step` asks the scheduler which
//! requests run how many tokens, runs them all in one forward pass, samples every request that
//! reached the end of its known tokens, and streams the results through each request's channel.
//! Finished or cancelled requests free their blocks at once.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use candle_core::{DType, Tensor};
use triage_core::{
    FinishReason as CoreFinish, KvCacheManager, Request, Scheduler, SchedulerConfig,
};

/// A request's handle inside one engine.
pub use triage_core::RequestId;
use triage_models::model::Model;
use triage_models::paged_kv_cache::{default_kv_dtype, PagedKvCache, PagedStep, SeqStep};
use triage_ops::{logits_reduce, LogitsStats, MAX_TOP_K};

use crate::generate::{
    resolve_max_tokens, tokenize_prompt, FinishReason, GenerateRequest, TokenOutput,
};
use crate::output_processor::{OutputProcessor, Processed};
use crate::prefix_remote::PrefixRemote;
use crate::{EngineError, Result};
use decode_graphs::DecodeGraphs;

mod decode_graphs;
mod kv_budget;
mod pin_book;
mod prefixes;

pub use kv_budget::KvBudget;
pub use prefixes::{PendingPin, PinStart, PrefixSource};

/// Sizes of the cache and of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineConfig {
    /// How much memory the model's KV blocks may take.
    pub kv_budget: KvBudget,
    pub block_size: usize,
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    pub prefix_caching: bool,
    /// Dtype of the KV blocks; `None` takes the device's default (`default_kv_dtype`: f16 on the
    /// CPU, bf16 on a GPU).
    pub kv_dtype: Option<DType>,
    /// Replay decode steps from captured graphs (`llm_engine/decode_graphs.rs`): CUDA graphs on
    /// a GPU; on the CPU the same path with the captured step run again (for tests: no faster
    /// than eager). Off by default until a GPU run has shown graphed tokens match eager ones.
    pub cuda_graphs: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            kv_budget: KvBudget::Blocks(1024),
            block_size: 16,
            max_num_batched_tokens: 2048,
            max_num_seqs: 64,
            prefix_caching: true,
            kv_dtype: None,
            cuda_graphs: false,
        }
    }
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens found in the prefix cache.
    pub cached_tokens: usize,
}

/// What a request's channel receives.
#[derive(Debug, Clone)]
pub enum StreamEvent {
    /// A generated token and the text it adds (already cut at stop strings; may be empty).
    Token(TokenOutput, String),
    /// Text held back until the end (an incomplete UTF-8 sequence or a stop-string prefix).
    Text(String),
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
}

/// Where a request's events go: a channel, or whatever the caller wraps (the server wraps an
/// async channel). A sink whose listener has gone gets its request cancelled, so a client that
/// disconnects frees its blocks.
pub trait EventSink: Send {
    /// Deliver one event; `false` when nobody listens any more.
    fn send(&mut self, event: StreamEvent) -> bool;
    /// Whether the listener has gone, checked before every step (so a request is cancelled even
    /// while it waits for its first token).
    fn is_closed(&self) -> bool {
        false
    }
}

impl EventSink for Sender<StreamEvent> {
    fn send(&mut self, event: StreamEvent) -> bool {
        Sender::send(self, event).is_ok()
    }
}

/// A request inside the engine: its output side and where its events go.
struct SeqState {
    output: OutputProcessor,
    tx: Box<dyn EventSink>,
}

/// The hidden states of one step: the union of the layers its rows asked for, one tensor
/// (`[rows, hidden]`) per layer.
struct HiddenStep {
    layers: Vec<usize>,
    hidden: Vec<Tensor>,
}

impl HiddenStep {
    /// Row `row`'s state at each of `wanted` (a subset of `layers`), in `wanted`'s order.
    fn row(&self, wanted: &[usize], row: usize) -> Result<Vec<Vec<f32>>> {
        wanted
            .iter()
            .map(|l| {
                let at = self.layers.iter().position(|x| x == l).ok_or_else(|| {
                    EngineError::Invalid(format!("layer {l} was not in this step's pass"))
                })?;
                Ok(self.hidden[at].get(row)?.to_vec1::<f32>()?)
            })
            .collect()
    }
}

/// A continuous-batching engine for one model.
pub struct LlmEngine {
    model: Arc<Model>,
    scheduler: Scheduler,
    cache: PagedKvCache,
    states: HashMap<RequestId, SeqState>,
    next_id: RequestId,
    num_preemptions: usize,
    num_abandoned: usize,
    /// The shared store behind persisted-prefix directories, if any.
    prefix_remote: Option<Arc<dyn PrefixRemote>>,
    /// Captured decode steps, when `EngineConfig::cuda_graphs` is on.
    graphs: Option<DecodeGraphs>,
    /// Pins begun for a `PinJob`, prefilling or held.
    pins: pin_book::PinBook,
}

impl std::fmt::Debug for LlmEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmEngine")
            .field("model", &self.model.name)
            .field("requests", &self.states.len())
            .finish()
    }
}

impl LlmEngine {
    pub fn new(model: Arc<Model>, config: EngineConfig) -> Result<Self> {
        let cfg = model.transformer.config();
        let device = model.transformer.device();
        let kv_dtype = config.kv_dtype.unwrap_or_else(|| default_kv_dtype(device));
        let bytes_per_block =
            PagedKvCache::bytes_per_block(cfg, config.block_size.max(1), kv_dtype);
        let num_blocks = config.kv_budget.num_blocks(bytes_per_block, device)?;
        let cache = PagedKvCache::new(cfg, num_blocks, config.block_size, 0.0, kv_dtype, device)?;
        let kv = KvCacheManager::new(
            num_blocks,
            config.block_size,
            &model.name,
            config.prefix_caching,
        );
        let sched = SchedulerConfig {
            max_num_batched_tokens: config.max_num_batched_tokens,
            max_num_seqs: config.max_num_seqs,
        };
        let graphs = config
            .cuda_graphs
            .then(|| DecodeGraphs::new(Arc::clone(&model), cache.clone()));
        Ok(Self {
            graphs,
            model,
            scheduler: Scheduler::new(sched, kv),
            cache,
            states: HashMap::new(),
            next_id: 1,
            num_preemptions: 0,
            num_abandoned: 0,
            prefix_remote: None,
            pins: pin_book::PinBook::default(),
        })
    }

    /// Share persisted prefixes through `remote`: a prefix missing from the directory a pin is
    /// given is fetched from it, and every prefix saved is published to it.
    pub fn set_prefix_remote(&mut self, remote: Option<Arc<dyn PrefixRemote>>) {
        self.prefix_remote = remote;
    }

    /// The scheduler (for its queues and the KV block counts).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Requests preempted (blocks taken back, recomputed later) since the engine started.
    pub fn num_preemptions(&self) -> usize {
        self.num_preemptions
    }

    /// Requests cancelled because their listener went away (a client disconnected).
    pub fn num_abandoned(&self) -> usize {
        self.num_abandoned
    }

    /// Whether any request is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.states.is_empty()
    }

    /// Queue a request; its tokens arrive on the returned channel as steps run. A token's entropy
    /// is the step's value under the request's estimator and unit; a threshold with
    /// `stop_on_escalate` ends the request with [`FinishReason::Escalate`] once its monitor
    /// escalates (other thresholds are the router's to apply).
    pub fn add_request(
        &mut self,
        request: &GenerateRequest,
    ) -> Result<(RequestId, Receiver<StreamEvent>)> {
        let (tx, rx) = channel();
        let id = self.add_request_with_sink(request, Box::new(tx))?;
        Ok((id, rx))
    }

    /// Queue a request whose events go to `sink`. Invalid parameters, a prompt that does not fit
    /// the context or the pool, or a chat the template cannot render are errors here, before
    /// anything is queued.
    pub fn add_request_with_sink(
        &mut self,
        request: &GenerateRequest,
        sink: Box<dyn EventSink>,
    ) -> Result<RequestId> {
        let params = &request.params;
        params.validate()?;
        crate::generate::check_hidden_layers(&self.model, params)?;
        let prompt = tokenize_prompt(&self.model, &request.prompt)?;
        let vocab = self.model.transformer.config().vocab_size;
        if let Some(bad) = params
            .score_token_ids
            .iter()
            .find(|&&t| t as usize >= vocab)
        {
            return Err(EngineError::InvalidSampling {
                param: "score_token_ids",
                message: format!("token id {bad} is outside the vocabulary (0..{vocab})"),
            });
        }
        let max_tokens =
            resolve_max_tokens(prompt.len(), params.max_tokens, self.model.context_length())?;
        let kv = self.scheduler.kv();
        let blocks_needed = (prompt.len() + max_tokens).div_ceil(kv.block_size());
        // Pinned prefixes the request does not share can never be had.
        let attainable = kv.attainable_blocks(&kv.get_computed_blocks(&prompt, None));
        if blocks_needed > attainable {
            return Err(EngineError::Invalid(format!(
                "prompt plus max_tokens needs {blocks_needed} KV blocks; the pool has {} and \
                 {} of them hold pinned prefixes this request does not share",
                kv.pool().num_total(),
                kv.pool().num_total() - attainable
            )));
        }
        let id = self.next_id;
        self.next_id += 1;
        let state = SeqState {
            output: OutputProcessor::new(request, &prompt, &self.model.tokenizer)?,
            tx: sink,
        };
        self.states.insert(id, state);
        self.scheduler
            .add_request(Request::new(id, prompt, max_tokens));
        Ok(id)
    }

    /// Requests waiting to be scheduled (for queue limits and metrics).
    pub fn num_waiting(&self) -> usize {
        self.scheduler.num_waiting()
    }

    /// Requests holding KV blocks.
    pub fn num_running(&self) -> usize {
        self.scheduler.num_running()
    }

    /// The model this engine runs.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Stop a request now and free its blocks; its channel gets `Finished { Cancelled }`.
    pub fn cancel(&mut self, id: RequestId) {
        let cached = self.scheduler.cancel(id).map_or(0, |r| r.num_cached_tokens);
        self.finish(id, FinishReason::Cancelled, cached);
    }

    /// Cancel every request (at a forced shutdown): each channel gets `Finished { Cancelled }`.
    pub fn cancel_all(&mut self) {
        let ids: Vec<RequestId> = self.states.keys().copied().collect();
        ids.into_iter().for_each(|id| self.cancel(id));
    }

    /// End every request with [`FinishReason::Error`] after a step failed (the forward pass
    /// itself, which all of them share), and free their blocks.
    pub fn fail_all(&mut self, message: &str) {
        let ids: Vec<RequestId> = self.states.keys().copied().collect();
        for id in ids {
            let cached = self.scheduler.cancel(id).map_or(0, |r| r.num_cached_tokens);
            self.finish(id, FinishReason::Error(message.to_string()), cached);
        }
    }

    /// Run one step. Returns the number of tokens run (0 when there is nothing to do).
    pub fn step(&mut self) -> Result<usize> {
        self.cancel_pins();
        let run = self.step_scheduled();
        self.publish_pin_progress();
        run
    }

    /// The step itself: schedule, one forward pass, sample, retire.
    fn step_scheduled(&mut self) -> Result<usize> {
        let gone: Vec<RequestId> = self
            .states
            .iter()
            .filter(|(_, s)| s.tx.is_closed())
            .map(|(&id, _)| id)
            .collect();
        self.num_abandoned += gone.len();
        gone.into_iter().for_each(|id| self.cancel(id));
        let plan = self.scheduler.schedule();
        self.num_preemptions += plan.preempted.len();
        for refused in &plan.refused {
            let message = format!(
                "the request needs {} KV blocks and only {} can be had (the others hold pinned \
                 prefixes); raise kv_budget or ask for fewer tokens",
                refused.num_blocks_needed, refused.num_blocks_free
            );
            self.finish(
                refused.id,
                FinishReason::Error(message),
                refused.num_cached_tokens,
            );
        }
        if plan.scheduled.is_empty() {
            return Ok(0);
        }
        let mut ids = Vec::new();
        let mut seqs = Vec::with_capacity(plan.scheduled.len());
        let (mut rows, mut samplers) = (Vec::new(), Vec::new());
        for s in &plan.scheduled {
            let req = self
                .scheduler
                .request(s.id)
                .ok_or_else(|| EngineError::Invalid(format!("request {} vanished", s.id)))?;
            let tokens = req.all_tokens();
            ids.extend_from_slice(
                &tokens[s.num_computed_tokens..s.num_computed_tokens + s.num_tokens],
            );
            seqs.push(SeqStep {
                block_table: s.block_table.clone(),
                num_computed_tokens: s.num_computed_tokens,
                num_new_tokens: s.num_tokens,
            });
            if s.samples {
                rows.push(ids.len() - 1);
                samplers.push(s.id);
            }
        }
        // One pass serves every row: the union of the layers this step's samplers want.
        let mut layers: Vec<usize> = samplers
            .iter()
            .filter_map(|id| self.states.get(id))
            .flat_map(|s| s.output.hidden_now().iter().copied())
            .collect();
        layers.sort_unstable();
        layers.dedup();
        let graph = self
            .graphs
            .as_mut()
            .filter(|g| layers.is_empty() && samplers.len() == ids.len() && g.fits(&seqs));
        let (logits, hidden) = match graph {
            Some(graphs) => (graphs.run(&ids, &seqs)?, Vec::new()),
            None => self.eager_forward(&ids, &seqs, rows, &layers)?,
        };
        let hidden = HiddenStep { layers, hidden };
        let sampled = if samplers.is_empty() {
            Vec::new()
        } else {
            self.sample_all(&logits, &hidden, &samplers)?
        };
        let finished = self.scheduler.update(&plan, &sampled);
        for (req, reason) in finished {
            let reason = match reason {
                CoreFinish::Eos => FinishReason::Stop,
                CoreFinish::Length => FinishReason::Length,
                CoreFinish::Cancelled => FinishReason::Cancelled,
            };
            self.finish(req.id, reason, req.num_cached_tokens);
        }
        Ok(ids.len())
    }

    /// The step's forward pass, run op by op: the logits of `rows` (or of the last token, for a
    /// step of prefill chunks only, which samples nothing), in the LM head's dtype, and the
    /// hidden states of `layers`.
    fn eager_forward(
        &self,
        ids: &[u32],
        seqs: &[SeqStep],
        rows: Vec<usize>,
        layers: &[usize],
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let mut backend = PagedStep::new(&self.cache, seqs)?;
        let positions = backend.positions();
        let logit_rows = if rows.is_empty() {
            vec![ids.len() - 1]
        } else {
            rows
        };
        let transformer = &self.model.transformer;
        let inputs = transformer.inputs(ids, &positions, &logit_rows)?;
        Ok(transformer.forward_inputs(&inputs, layers, &mut backend)?)
    }

    /// Decode buckets captured so far (0 with `cuda_graphs` off).
    pub fn num_captured_graphs(&self) -> usize {
        self.graphs.as_ref().map_or(0, DecodeGraphs::num_captured)
    }

    /// `[rows, nodes]` of each captured CUDA graph, by bucket: the kernel launches, copies and
    /// memsets one replay makes. Empty on the CPU and with graphs off.
    pub fn graph_nodes(&self) -> Result<Vec<[usize; 2]>> {
        self.graphs
            .as_ref()
            .map_or(Ok(Vec::new()), DecodeGraphs::node_counts)
    }

    /// Sample every row, stream tokens, and end requests that hit a stop string or EOS. A row
    /// that cannot be sampled (non-finite logits after its penalties) ends its own request with
    /// [`FinishReason::Error`]; the other rows go on.
    fn sample_all(
        &mut self,
        logits: &Tensor,
        hidden: &HiddenStep,
        ids: &[RequestId],
    ) -> Result<Vec<(RequestId, u32)>> {
        let k = ids
            .iter()
            .filter_map(|id| self.states.get(id))
            .map(|s| s.output.reduction_k())
            .max()
            .unwrap_or(0)
            .min(MAX_TOP_K);
        // One copy of the reduced rows; a logits row leaves the device only for a sampler that
        // draws or penalises, or a request that scores tokens.
        let stats = logits_reduce(logits, k)?;
        let mut sampled = Vec::with_capacity(ids.len());
        let mut stopped = Vec::new();
        for (row, (&id, stat)) in ids.iter().zip(&stats).enumerate() {
            match self.sample_row(logits, hidden, row, id, stat) {
                Ok(RowOutcome::Token(token)) => sampled.push((id, token)),
                Ok(RowOutcome::Finished(reason)) => stopped.push((id, reason)),
                Ok(RowOutcome::Gone) => {}
                Err(e) => stopped.push((id, FinishReason::Error(e.to_string()))),
            }
        }
        for (id, reason) in stopped {
            let cached = self.scheduler.cancel(id).map_or(0, |r| r.num_cached_tokens);
            sampled.retain(|(s, _)| *s != id);
            self.finish(id, reason, cached);
        }
        Ok(sampled)
    }

    /// Sample row `row` for request `id` and stream its token. Errors are this request's alone.
    fn sample_row(
        &mut self,
        logits: &Tensor,
        hidden: &HiddenStep,
        row: usize,
        id: RequestId,
        stat: &LogitsStats,
    ) -> Result<RowOutcome> {
        let Some(state) = self.states.get_mut(&id) else {
            return Ok(RowOutcome::Gone);
        };
        let tokenizer = &self.model.tokenizer;
        let (output, text, ends) =
            match state
                .output
                .process(tokenizer, logits, row, stat, |layers| {
                    hidden.row(layers, row)
                })? {
                Processed::Eos => return Ok(RowOutcome::Finished(FinishReason::Stop)),
                Processed::Token { output, text, ends } => (output, text, ends),
            };
        let token = output.id;
        let listening = state.tx.send(StreamEvent::Token(output, text));
        if let Some(reason) = ends {
            return Ok(RowOutcome::Finished(reason));
        }
        if !listening {
            self.num_abandoned += 1;
            return Ok(RowOutcome::Finished(FinishReason::Cancelled));
        }
        Ok(RowOutcome::Token(token))
    }

    fn finish(&mut self, id: RequestId, reason: FinishReason, cached_tokens: usize) {
        let Some(mut state) = self.states.remove(&id) else {
            return;
        };
        let tail = state.output.finish_text(&self.model.tokenizer);
        if !tail.is_empty() {
            let _ = state.tx.send(StreamEvent::Text(tail));
        }
        let usage = Usage {
            prompt_tokens: state.output.prompt_tokens(),
            completion_tokens: state.output.completion_tokens(),
            cached_tokens,
        };
        let _ = state.tx.send(StreamEvent::Finished {
            reason: reason.clone(),
            usage,
        });
        self.settle_pin(id, &reason);
    }
}

/// What sampling one row did to its request.
enum RowOutcome {
    /// A token to append; the request goes on.
    Token(u32),
    /// The request ends here (its token, if any, was streamed).
    Finished(FinishReason),
    /// The request had already ended.
    Gone,
}
