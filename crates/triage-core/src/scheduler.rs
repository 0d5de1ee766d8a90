//! `Scheduler`: waiting and running queues, a per-step token budget, chunked prefill, decodes
//! first, and preemption by recompute when blocks run out. Its output is a plain
//! `SchedulerOutput`: which request runs how many tokens this step.

use std::collections::VecDeque;

use crate::kv_cache_manager::{ComputedBlocks, KvCacheManager, RequestId};

/// Limits of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most tokens (prefill chunks plus decodes) in one forward pass.
    pub max_num_batched_tokens: usize,
    /// Most requests running at once.
    pub max_num_seqs: usize,
}

/// A request as the scheduler sees it: token ids and counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub id: RequestId,
    /// Prompt followed by the output so far, in one vector so a step borrows it without copying.
    tokens: Vec<u32>,
    num_prompt_tokens: usize,
    pub max_tokens: usize,
    pub eos_token_ids: Vec<u32>,
    pub cache_salt: Option<String>,
    /// Tokens whose K/V are in the cache.
    pub num_computed_tokens: usize,
    /// Tokens of the prompt found in the prefix cache when it was first scheduled.
    pub num_cached_tokens: usize,
}

impl Request {
    pub fn new(id: RequestId, prompt: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            id,
            num_prompt_tokens: prompt.len(),
            tokens: prompt,
            max_tokens,
            eos_token_ids: Vec::new(),
            cache_salt: None,
            num_computed_tokens: 0,
            num_cached_tokens: 0,
        }
    }

    /// Prompt followed by the output so far.
    pub fn all_tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn prompt(&self) -> &[u32] {
        &self.tokens[..self.num_prompt_tokens]
    }

    pub fn output(&self) -> &[u32] {
        &self.tokens[self.num_prompt_tokens..]
    }

    fn num_tokens(&self) -> usize {
        self.tokens.len()
    }
}

/// One request's share of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledRequest {
    pub id: RequestId,
    /// Position of the first token run this step.
    pub num_computed_tokens: usize,
    pub num_tokens: usize,
    pub block_table: Vec<u32>,
    /// The step reaches the end of the known tokens, so a token is sampled.
    pub samples: bool,
}

/// A request that can never get its blocks: it ran out (or could not start) with no other
/// request holding any, so only the pinned prefixes stand in its way. It left the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub id: RequestId,
    /// Blocks it needed for this step.
    pub num_blocks_needed: usize,
    /// Blocks free (or evictable) when it was refused.
    pub num_blocks_free: usize,
    /// Prompt tokens it had found cached (for its usage).
    pub num_cached_tokens: usize,
}

/// What to run this step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    pub scheduled: Vec<ScheduledRequest>,
    /// Requests whose blocks were taken back this step; they recompute when rescheduled.
    pub preempted: Vec<RequestId>,
    /// Requests that can never run with the blocks there are; the caller ends them.
    pub refused: Vec<Refused>,
}

impl SchedulerOutput {
    pub fn total_tokens(&self) -> usize {
        self.scheduled.iter().map(|s| s.num_tokens).sum()
    }
}

/// Why a request left the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Eos,
    Length,
    Cancelled,
}

/// The scheduler of one model.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvCacheManager,
    waiting: VecDeque<Request>,
    running: Vec<Request>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, kv: KvCacheManager) -> Self {
        Self {
            config,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// The KV cache manager, for pinning prefixes between steps.
    pub fn kv_mut(&mut self) -> &mut KvCacheManager {
        &mut self.kv
    }

    pub fn add_request(&mut self, request: Request) {
        self.waiting.push_back(request);
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// A running or waiting request.
    pub fn request(&self, id: RequestId) -> Option<&Request> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .find(|r| r.id == id)
    }

    /// Plan one step: running requests first (oldest first), preempting the newest when blocks run
    /// out, then waiting requests while the budget lasts.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.config.max_num_batched_tokens;
        // With other requests about, a running prefill takes at most half a step's tokens: a
        // long prompt (a corpus prefix being pinned) then holds neither the decodes behind it in
        // the running queue nor newer requests back until it is done.
        let prefill_cap = if self.running.len() + self.waiting.len() > 1 {
            (budget / 2).max(1)
        } else {
            budget
        };
        let mut idx = 0;
        while idx < self.running.len() && budget > 0 {
            let req = &self.running[idx];
            let num_new = (req.num_tokens() - req.num_computed_tokens)
                .min(budget)
                .min(prefill_cap);
            let tokens = req.all_tokens();
            let salt = req.cache_salt.as_deref();
            let id = req.id;
            let none = ComputedBlocks::default();
            if self
                .kv
                .allocate_slots(id, tokens, num_new, &none, salt)
                .is_some()
            {
                out.scheduled.push(self.scheduled(idx, num_new));
                budget -= num_new;
                idx += 1;
                continue;
            }
            if self.running.len() == 1 {
                // Alone and still out of blocks: preempting itself would only restart it.
                let needed = (req.num_computed_tokens + num_new).div_ceil(self.kv.block_size());
                out.refused.push(self.refuse_running(needed));
                break;
            }
            // Out of blocks: preempt the newest running request (possibly this one) and retry.
            let victim = self
                .running
                .pop()
                .expect("idx < len, so running is not empty");
            self.kv.free(victim.id);
            out.scheduled.retain(|s| s.id != victim.id);
            out.preempted.push(victim.id);
            let mut victim = victim;
            victim.num_computed_tokens = 0;
            self.waiting.push_front(victim);
        }
        while budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(req) = self.waiting.front() else {
                break;
            };
            let tokens = req.all_tokens();
            let salt = req.cache_salt.as_deref();
            let computed = self.kv.get_computed_blocks(tokens, salt);
            let num_new = (tokens.len() - computed.num_computed_tokens).min(budget);
            let id = req.id;
            if self
                .kv
                .allocate_slots(id, tokens, num_new, &computed, salt)
                .is_none()
            {
                if !self.running.is_empty() {
                    break; // it waits for running requests to free their blocks
                }
                // Nothing else holds a block, so it never will fit: refuse it, try the next.
                let needed =
                    (computed.num_computed_tokens + num_new).div_ceil(self.kv.block_size());
                let num_cached_tokens = req.num_cached_tokens;
                out.refused.push(Refused {
                    id,
                    num_blocks_needed: needed,
                    num_blocks_free: self.kv.pool().num_free(),
                    num_cached_tokens,
                });
                self.waiting.pop_front();
                continue;
            }
            let mut req = self.waiting.pop_front().expect("front() was Some");
            req.num_computed_tokens = computed.num_computed_tokens;
            if req.output().is_empty() {
                req.num_cached_tokens = computed.num_computed_tokens;
            }
            self.running.push(req);
            out.scheduled
                .push(self.scheduled(self.running.len() - 1, num_new));
            budget -= num_new;
        }
        out
    }

    /// Take the one running request out, freeing its blocks, as refused.
    fn refuse_running(&mut self, num_blocks_needed: usize) -> Refused {
        let (id, num_cached_tokens) = (self.running[0].id, self.running[0].num_cached_tokens);
        self.kv.free(id);
        self.running.clear();
        Refused {
            id,
            num_blocks_needed,
            num_blocks_free: self.kv.pool().num_free(),
            num_cached_tokens,
        }
    }

    fn scheduled(&self, idx: usize, num_new: usize) -> ScheduledRequest {
        let req = &self.running[idx];
        ScheduledRequest {
            id: req.id,
            num_computed_tokens: req.num_computed_tokens,
            num_tokens: num_new,
            block_table: self
                .kv
                .block_table(req.id)
                .map(<[u32]>::to_vec)
                .unwrap_or_default(),
            samples: req.num_computed_tokens + num_new == req.num_tokens(),
        }
    }

    /// Apply a step's results: advance computed counts, append sampled tokens, finish requests
    /// that hit EOS or `max_tokens` (freeing their blocks). Returns the finished requests.
    pub fn update(
        &mut self,
        output: &SchedulerOutput,
        sampled: &[(RequestId, u32)],
    ) -> Vec<(Request, FinishReason)> {
        let mut finished = Vec::new();
        for s in &output.scheduled {
            let Some(req) = self.running.iter_mut().find(|r| r.id == s.id) else {
                continue;
            };
            req.num_computed_tokens += s.num_tokens;
            if !s.samples {
                continue;
            }
            let Some(&(_, token)) = sampled.iter().find(|(id, _)| *id == s.id) else {
                continue;
            };
            req.tokens.push(token);
            let reason = if req.eos_token_ids.contains(&token) {
                Some(FinishReason::Eos)
            } else if req.output().len() >= req.max_tokens {
                Some(FinishReason::Length)
            } else {
                None
            };
            if let Some(reason) = reason {
                let id = req.id;
                finished.push((self.remove(id), reason));
            }
        }
        finished
            .into_iter()
            .filter_map(|(r, reason)| r.map(|r| (r, reason)))
            .collect()
    }

    /// Cancel a request wherever it is; its blocks are freed at once.
    pub fn cancel(&mut self, id: RequestId) -> Option<Request> {
        if let Some(pos) = self.waiting.iter().position(|r| r.id == id) {
            return self.waiting.remove(pos);
        }
        self.remove(id)
    }

    fn remove(&mut self, id: RequestId) -> Option<Request> {
        let pos = self.running.iter().position(|r| r.id == id)?;
        self.kv.free(id);
        Some(self.running.remove(pos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheduler(num_blocks: usize, budget: usize) -> Scheduler {
        let config = SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs: 8,
        };
        Scheduler::new(config, KvCacheManager::new(num_blocks, 4, "m", true))
    }

    fn plan(out: &SchedulerOutput) -> Vec<(RequestId, usize, usize)> {
        out.scheduled
            .iter()
            .map(|s| (s.id, s.num_computed_tokens, s.num_tokens))
            .collect()
    }

    /// Feed back one sampled token (`100 + id`) per sampling request.
    fn step(s: &mut Scheduler) -> (SchedulerOutput, Vec<RequestId>) {
        let out = s.schedule();
        let sampled: Vec<_> = out
            .scheduled
            .iter()
            .filter(|r| r.samples)
            .map(|r| (r.id, 100 + r.id as u32))
            .collect();
        let done = s
            .update(&out, &sampled)
            .into_iter()
            .map(|(r, _)| r.id)
            .collect();
        (out, done)
    }

    /// A long prefill under way leaves half of each step to a request that arrives after it.
    #[test]
    fn a_long_prefill_shares_the_step_with_a_newcomer() {
        let mut s = scheduler(64, 8);
        s.add_request(Request::new(1, (0..40).collect(), 1));
        let (out, _) = step(&mut s);
        assert_eq!(plan(&out), vec![(1, 0, 8)]);
        s.add_request(Request::new(2, (100..104).collect(), 2));
        let (out, _) = step(&mut s);
        assert_eq!(plan(&out), vec![(1, 8, 4), (2, 0, 4)]);
        // The newcomer's decode is not held back behind the prefill either.
        let (out, _) = step(&mut s);
        assert_eq!(plan(&out), vec![(1, 12, 4), (2, 4, 1)]);
    }

    #[test]
    fn chunked_prefill_then_decodes_first() {
        let mut s = scheduler(64, 8);
        s.add_request(Request::new(1, (0..10).collect(), 3));
        let (out, _) = step(&mut s);
        assert_eq!(plan(&out), vec![(1, 0, 8)], "prefill chunked to the budget");
        assert!(!out.scheduled[0].samples);
        s.add_request(Request::new(2, (50..56).collect(), 2));
        let (out, _) = step(&mut s);
        assert_eq!(
            plan(&out),
            vec![(1, 8, 2), (2, 0, 6)],
            "running first, then the new prefill"
        );
        let (out, done) = step(&mut s);
        assert_eq!(
            plan(&out),
            vec![(1, 10, 1), (2, 6, 1)],
            "two decodes in one step"
        );
        assert_eq!(done, vec![2]);
        let (out, done) = step(&mut s);
        assert_eq!(plan(&out), vec![(1, 11, 1)]);
        assert_eq!(done, vec![1]);
        assert_eq!(
            s.kv().pool().num_used(),
            0,
            "finished requests free their blocks"
        );
    }

    #[test]
    fn shared_prefix_is_not_recomputed() {
        let mut s = scheduler(64, 64);
        let prefix: Vec<u32> = (0..16).collect();
        s.add_request(Request::new(1, [prefix.clone(), vec![1, 2]].concat(), 1));
        step(&mut s);
        s.add_request(Request::new(2, [prefix, vec![3, 4, 5]].concat(), 1));
        let (out, _) = step(&mut s);
        assert_eq!(plan(&out), vec![(2, 16, 3)]);
    }

    #[test]
    fn preemption_frees_blocks_and_the_victim_recomputes() {
        // 6 usable blocks of 4 tokens; two requests of 8-token prompts each need 3 blocks once
        // they decode past 12 tokens.
        let mut s = scheduler(7, 64);
        s.add_request(Request::new(1, (0..8).collect(), 10));
        s.add_request(Request::new(2, (20..28).collect(), 10));
        let mut preempted = Vec::new();
        let mut finished = Vec::new();
        for _ in 0..40 {
            let (out, done) = step(&mut s);
            preempted.extend(out.preempted.iter().copied());
            finished.extend(done);
            let pool = s.kv().pool();
            assert_eq!(pool.num_free() + pool.num_used(), pool.num_total());
            if finished.len() == 2 {
                break;
            }
        }
        assert_eq!(preempted, vec![2], "the newest request is preempted");
        assert_eq!(finished, vec![1, 2]);
        assert_eq!(s.kv().pool().num_used(), 0);
    }

    #[test]
    fn cancellation_frees_blocks_mid_prefill_and_mid_decode() {
        let mut s = scheduler(64, 4);
        s.add_request(Request::new(1, (0..12).collect(), 5));
        s.add_request(Request::new(2, (0..3).collect(), 5));
        step(&mut s); // request 1 mid-prefill
        assert!(s.cancel(1).is_some());
        step(&mut s);
        step(&mut s); // request 2 decoding
        assert!(s.cancel(2).is_some());
        assert_eq!(s.kv().pool().num_used(), 0);
        assert!(s.cancel(3).is_none());
    }

    /// Pin `num_blocks` blocks' worth of a prefix (as a loaded corpus does).
    fn pin(s: &mut Scheduler, num_blocks: usize) -> Vec<u32> {
        let prefix: Vec<u32> = (0..num_blocks as u32 * 4).map(|t| 7 + t).collect();
        let (handle, _) = s.kv_mut().import_prefix(&prefix, None).unwrap();
        assert_eq!(handle.blocks.len(), num_blocks);
        prefix
    }

    /// A request over a pinned prefix starts with the blocks the pins leave (the pinned blocks
    /// are shared, not taken from the free ones), and when it outgrows them, alone, it is
    /// refused once instead of preempting itself and starting over forever (the long-context
    /// hang over a big corpus).
    #[test]
    fn a_lone_request_that_outgrows_the_unpinned_blocks_is_refused() {
        let mut s = scheduler(10, 64); // 9 usable blocks of 4 tokens
        let prefix = pin(&mut s, 6);
        let mut prompt = prefix.clone();
        prompt.extend([1, 2]);
        s.add_request(Request::new(1, prompt, 1000));
        let mut refused = None;
        for _ in 0..100 {
            let (out, done) = step(&mut s);
            assert!(done.is_empty());
            if let Some(r) = out.refused.first() {
                refused = Some(*r);
                break;
            }
        }
        let r = refused.expect("refused within 100 steps, not looping");
        assert_eq!(r.id, 1);
        assert_eq!(
            r.num_cached_tokens, 24,
            "the pinned prefix was shared: {r:?}"
        );
        assert_eq!(r.num_blocks_needed, 10, "{r:?}");
        assert_eq!((s.num_running(), s.num_waiting()), (0, 0));
        assert_eq!(s.kv().pool().num_used(), 6, "only the pins hold blocks");
    }

    /// A waiting request that cannot start with nothing running is refused and the next one
    /// runs; one that only waits for running requests to finish is not.
    #[test]
    fn a_head_that_can_never_start_is_refused_and_the_queue_moves_on() {
        let mut s = scheduler(10, 64);
        pin(&mut s, 7); // 2 blocks left
        s.add_request(Request::new(1, (500..516).collect(), 4)); // 4+ blocks
        s.add_request(Request::new(2, vec![1, 2, 3], 2)); // 2 blocks
        let out = s.schedule();
        assert_eq!(out.refused.len(), 1);
        assert_eq!(out.refused[0].id, 1);
        assert_eq!(out.refused[0].num_blocks_free, 2);
        assert_eq!(plan(&out), vec![(2, 0, 3)]);
        // With room taken by a running request, a newcomer waits instead.
        let mut s = scheduler(10, 64);
        s.add_request(Request::new(1, (0..20).collect(), 4)); // 5 blocks at first
        s.add_request(Request::new(2, (100..116).collect(), 2)); // needs 4, 4 left... then 3
        let out = s.schedule();
        assert!(out.refused.is_empty());
        assert_eq!(plan(&out), vec![(1, 0, 20), (2, 0, 16)]);
    }
}
