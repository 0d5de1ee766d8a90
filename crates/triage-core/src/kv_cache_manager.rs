//! `KvCacheManager`: which blocks each request holds, prefix-cache lookups over chained block
//! hashes, and pinned prefixes. Out of blocks is a value (`None`), never a panic.

use std::collections::HashMap;

use crate::block_hash::{hash_block, BlockHash};
use crate::block_pool::{BlockId, BlockPool};

/// A request's stable handle.
pub type RequestId = u64;

/// A cached prefix kept resident by [`KvCacheManager::pin_prefix`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixHandle {
    pub blocks: Vec<BlockId>,
    pub num_tokens: usize,
}

/// Blocks of a request's longest cached prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComputedBlocks {
    pub blocks: Vec<BlockId>,
    pub num_computed_tokens: usize,
}

#[derive(Debug, Default)]
struct RequestBlocks {
    blocks: Vec<BlockId>,
    /// Tokens whose slots have been allocated (computed or being computed this step).
    num_tokens: usize,
    /// Hashes of the request's full blocks registered so far (a chain).
    hashes: Vec<BlockHash>,
}

/// Per-model KV block bookkeeping.
#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    model_id: String,
    prefix_caching: bool,
    requests: HashMap<RequestId, RequestBlocks>,
}

impl KvCacheManager {
    /// A manager over `num_blocks` blocks of `block_size` tokens (one is the null block).
    pub fn new(num_blocks: usize, block_size: usize, model_id: &str, prefix_caching: bool) -> Self {
        Self {
            pool: BlockPool::new(num_blocks),
            block_size: block_size.max(1),
            model_id: model_id.to_string(),
            prefix_caching,
            requests: HashMap::new(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Fraction of blocks in use (held by requests or pinned).
    pub fn usage(&self) -> f32 {
        self.pool.num_used() as f32 / self.pool.num_total().max(1) as f32
    }

    /// The longest run of full blocks of `tokens` already cached. At least the last token is
    /// always left to compute (its logits are needed), so a fully cached prompt reports one block
    /// fewer when the prompt is a whole number of blocks.
    pub fn get_computed_blocks(&self, tokens: &[u32], salt: Option<&str>) -> ComputedBlocks {
        if !self.prefix_caching || tokens.is_empty() {
            return ComputedBlocks::default();
        }
        let max_blocks = (tokens.len() - 1) / self.block_size;
        let mut out = ComputedBlocks::default();
        let mut parent = None;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let hash = hash_block(parent, chunk, &self.model_id, salt);
            match self.pool.lookup(hash) {
                Some(id) => out.blocks.push(id),
                None => break,
            }
            parent = Some(hash);
        }
        out.num_computed_tokens = out.blocks.len() * self.block_size;
        out
    }

    /// Make room for `num_new_tokens` more tokens of request `req`, after those already given
    /// slots (`computed`, from [`Self::get_computed_blocks`], counts on its first call). `tokens` are
    /// the request's known tokens, used to hash blocks that become full. Returns the
    /// request's block table, or `None` — taking nothing — when blocks run out.
    pub fn allocate_slots(
        &mut self,
        req: RequestId,
        tokens: &[u32],
        num_new_tokens: usize,
        computed: &ComputedBlocks,
        salt: Option<&str>,
    ) -> Option<&[BlockId]> {
        let first_call = !self.requests.contains_key(&req);
        let held = if first_call {
            computed.blocks.len()
        } else {
            self.requests[&req].blocks.len()
        };
        let num_tokens_before = match self.requests.get(&req) {
            Some(entry) => entry.num_tokens,
            None => computed.num_computed_tokens,
        };
        let needed_blocks = (num_tokens_before + num_new_tokens).div_ceil(self.block_size);
        let new_blocks = needed_blocks.saturating_sub(held);
        // Reviving cached blocks from the free queue also takes free blocks; pinned blocks are
        // not in it (counting them made a request over a pinned corpus wait forever).
        let revived = if first_call {
            computed
                .blocks
                .iter()
                .filter(|&&b| self.pool.ref_count(b) == 0 && !self.pool.is_pinned(b))
                .count()
        } else {
            0
        };
        if new_blocks + revived > self.pool.num_free() {
            return None;
        }
        if first_call {
            let mut entry = RequestBlocks::default();
            for &b in &computed.blocks {
                self.pool.acquire(b);
                entry.blocks.push(b);
            }
            let mut parent = None;
            for chunk in tokens
                .chunks_exact(self.block_size)
                .take(computed.blocks.len())
            {
                let h = hash_block(parent, chunk, &self.model_id, salt);
                entry.hashes.push(h);
                parent = Some(h);
            }
            self.requests.insert(req, entry);
        }
        let fresh = self.pool.allocate(new_blocks)?;
        let model_id = self.model_id.clone();
        let entry = self.requests.get_mut(&req)?;
        entry.blocks.extend(fresh);
        entry.num_tokens = num_tokens_before + num_new_tokens;
        if self.prefix_caching {
            // Blocks whose tokens are all known after this step get their hashes registered.
            let num_full =
                ((num_tokens_before + num_new_tokens).min(tokens.len())) / self.block_size;
            while entry.hashes.len() < num_full {
                let idx = entry.hashes.len();
                let chunk = &tokens[idx * self.block_size..(idx + 1) * self.block_size];
                let h = hash_block(entry.hashes.last().copied(), chunk, &model_id, salt);
                entry.hashes.push(h);
                self.pool.cache(entry.blocks[idx], h);
            }
        }
        Some(&self.requests.get(&req)?.blocks)
    }

    /// The block table of a request.
    /// The most blocks a request sharing the cached prefix `computed` could ever hold: every
    /// block but the pinned ones it does not share. Other requests' blocks count: they end.
    pub fn attainable_blocks(&self, computed: &ComputedBlocks) -> usize {
        let shared_pinned = computed
            .blocks
            .iter()
            .filter(|&&b| self.pool.is_pinned(b))
            .count();
        self.pool.num_total() - self.pool.num_pinned() + shared_pinned
    }

    pub fn block_table(&self, req: RequestId) -> Option<&[BlockId]> {
        self.requests.get(&req).map(|r| r.blocks.as_slice())
    }

    /// Release a finished, cancelled or preempted request's blocks (tail first, so its prefix is
    /// evicted last). Unknown ids are ignored.
    pub fn free(&mut self, req: RequestId) {
        if let Some(entry) = self.requests.remove(&req) {
            let reversed: Vec<BlockId> = entry.blocks.iter().rev().copied().collect();
            self.pool.release(&reversed);
        }
    }

    /// Keep the cached full blocks of `tokens` resident; `None` unless every full block is cached.
    pub fn pin_prefix(&mut self, tokens: &[u32], salt: Option<&str>) -> Option<PrefixHandle> {
        let num_full = tokens.len() / self.block_size;
        let mut blocks = Vec::with_capacity(num_full);
        let mut parent = None;
        for chunk in tokens.chunks_exact(self.block_size) {
            let h = hash_block(parent, chunk, &self.model_id, salt);
            blocks.push(self.pool.lookup(h)?);
            parent = Some(h);
        }
        blocks.iter().for_each(|&b| self.pool.pin(b));
        Some(PrefixHandle {
            num_tokens: blocks.len() * self.block_size,
            blocks,
        })
    }

    /// Undo [`Self::pin_prefix`].
    pub fn unpin_prefix(&mut self, handle: &PrefixHandle) {
        handle.blocks.iter().for_each(|&b| self.pool.unpin(b));
    }

    /// Pin the full blocks of `tokens` whose contents come from outside (a persisted prefix):
    /// blocks already cached are reused, the rest are taken from the free queue and registered
    /// under their hashes. Returns the handle and the indices (into `handle.blocks`) of the blocks
    /// the caller must now fill; `None` (and nothing taken) when the pool is too small.
    ///
    /// The caller writes those blocks before the next step: until then they are cached but empty.
    pub fn import_prefix(
        &mut self,
        tokens: &[u32],
        salt: Option<&str>,
    ) -> Option<(PrefixHandle, Vec<usize>)> {
        let mut hashes = Vec::with_capacity(tokens.len() / self.block_size);
        let mut parent = None;
        for chunk in tokens.chunks_exact(self.block_size) {
            let h = hash_block(parent, chunk, &self.model_id, salt);
            hashes.push(h);
            parent = Some(h);
        }
        let found: Vec<Option<BlockId>> = hashes.iter().map(|&h| self.pool.lookup(h)).collect();
        // Pin the cached blocks first: allocating the rest must not evict them (a cached block
        // nobody holds sits in the free queue).
        found.iter().flatten().for_each(|&b| self.pool.pin(b));
        let missing: Vec<usize> = (0..hashes.len()).filter(|&i| found[i].is_none()).collect();
        let Some(fresh) = self.pool.allocate(missing.len()) else {
            found.iter().flatten().for_each(|&b| self.pool.unpin(b));
            return None;
        };
        let mut fresh = fresh.into_iter();
        let mut blocks = Vec::with_capacity(hashes.len());
        for (h, cached) in hashes.iter().zip(&found) {
            let id = match cached {
                Some(id) => *id,
                // Invariant: `fresh` holds exactly one block per missing hash, in order.
                None => {
                    let id = fresh.next()?;
                    self.pool.cache(id, *h);
                    self.pool.pin(id);
                    id
                }
            };
            blocks.push(id);
        }
        // The fresh blocks came out of `allocate` with one reference; pinning keeps them now.
        let taken: Vec<BlockId> = missing.iter().map(|&i| blocks[i]).collect();
        self.pool.release(&taken);
        let handle = PrefixHandle {
            num_tokens: blocks.len() * self.block_size,
            blocks,
        };
        Some((handle, missing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: usize, seed: u32) -> Vec<u32> {
        (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000)
            .collect()
    }

    fn assert_accounting(m: &KvCacheManager) {
        assert_eq!(
            m.pool().num_free() + m.pool().num_used(),
            m.pool().num_total()
        );
    }

    #[test]
    fn imported_prefix_is_pinned_and_found_by_later_requests() {
        let mut m = KvCacheManager::new(9, 4, "m", true);
        let prefix = tokens(13, 5);
        let (handle, to_fill) = m.import_prefix(&prefix, None).unwrap();
        assert_eq!(handle.num_tokens, 12);
        assert_eq!(to_fill, vec![0, 1, 2]);
        assert_eq!(m.pool().num_used(), 3);
        assert_accounting(&m);
        // A second import needs no data: every block is already cached.
        let (again, to_fill) = m.import_prefix(&prefix, None).unwrap();
        assert_eq!(again, handle);
        assert!(to_fill.is_empty());
        let c = m.get_computed_blocks(&prefix, None);
        assert_eq!(c.blocks, handle.blocks);
        assert_eq!(c.num_computed_tokens, 12);
        // Pinned blocks survive a request that wants every other block.
        let big = tokens(20, 9);
        let c = m.get_computed_blocks(&big, None);
        assert!(m.allocate_slots(1, &big, 20, &c, None).is_some());
        m.free(1);
        assert_eq!(m.get_computed_blocks(&prefix, None).num_computed_tokens, 12);
        // Two imports are two pins: the blocks stay until both are undone.
        m.unpin_prefix(&handle);
        assert_eq!(m.pool().num_used(), 3);
        m.unpin_prefix(&again);
        assert_eq!(m.pool().num_used(), 0);
        assert_accounting(&m);
    }

    /// A cached block nobody holds sits at the head of the free queue; importing a prefix that
    /// shares it must not hand it out as one of the fresh blocks (that evicted the shared
    /// block, failed the import and leaked the block taken).
    #[test]
    fn import_keeps_the_cached_blocks_it_shares_out_of_its_own_allocation() {
        let mut m = KvCacheManager::new(3, 4, "m", true);
        let shared = tokens(4, 1);
        for (id, prompt) in [(1, shared.clone()), (2, tokens(4, 2))] {
            let c = m.get_computed_blocks(&prompt, None);
            m.allocate_slots(id, &prompt, 4, &c, None).unwrap();
            m.free(id);
        }
        let mut prefix = shared.clone();
        prefix.extend(tokens(4, 3));
        let (handle, to_fill) = m.import_prefix(&prefix, None).expect("two blocks fit");
        assert_eq!(to_fill, vec![1]);
        let mut question = prefix.clone();
        question.push(7);
        assert_eq!(
            m.get_computed_blocks(&question, None).num_computed_tokens,
            8
        );
        assert_eq!(m.pool().num_pinned(), 2);
        m.unpin_prefix(&handle);
        assert_eq!(m.pool().num_used(), 0);
        assert_accounting(&m);
    }

    #[test]
    fn import_into_a_full_pool_takes_nothing() {
        let mut m = KvCacheManager::new(3, 4, "m", true);
        assert!(m.import_prefix(&tokens(12, 1), None).is_none());
        assert_eq!(m.pool().num_used(), 0);
        assert_accounting(&m);
    }

    #[test]
    fn second_request_reuses_the_shared_prefix() {
        let mut m = KvCacheManager::new(33, 4, "m", true);
        let prompt = tokens(18, 1);
        let c = m.get_computed_blocks(&prompt, None);
        assert_eq!(c.num_computed_tokens, 0);
        let table = m.allocate_slots(1, &prompt, 18, &c, None).unwrap().to_vec();
        assert_eq!(table.len(), 5);
        let mut other = prompt[..16].to_vec();
        other.extend([7, 7, 7]);
        let c2 = m.get_computed_blocks(&other, None);
        assert_eq!(c2.num_computed_tokens, 16);
        assert_eq!(c2.blocks, table[..4].to_vec());
        let t2 = m.allocate_slots(2, &other, 3, &c2, None).unwrap().to_vec();
        assert_eq!(&t2[..4], &table[..4]);
        assert_ne!(t2[4], table[4]);
        assert_accounting(&m);
        m.free(1);
        m.free(2);
        assert_eq!(m.pool().num_used(), 0);
        // Still cached after both finished; another model never sees them.
        assert_eq!(m.get_computed_blocks(&prompt, None).num_computed_tokens, 16);
        assert_eq!(
            m.get_computed_blocks(&prompt, Some("tenant"))
                .num_computed_tokens,
            0
        );
    }

    #[test]
    fn a_fully_cached_prompt_still_computes_its_last_token() {
        let mut m = KvCacheManager::new(9, 4, "m", true);
        let prompt = tokens(8, 2);
        let c = m.get_computed_blocks(&prompt, None);
        m.allocate_slots(1, &prompt, 8, &c, None).unwrap();
        m.free(1);
        assert_eq!(m.get_computed_blocks(&prompt, None).num_computed_tokens, 4);
    }

    #[test]
    fn out_of_blocks_is_none_and_takes_nothing() {
        let mut m = KvCacheManager::new(4, 4, "m", true);
        let c = ComputedBlocks::default();
        assert!(m.allocate_slots(1, &tokens(8, 3), 8, &c, None).is_some());
        assert!(m.allocate_slots(2, &tokens(8, 4), 8, &c, None).is_none());
        assert_eq!(m.pool().num_used(), 2);
        assert!(m.block_table(2).is_none());
        // Decode growth: one more block when the third block starts.
        let mut t = tokens(8, 3);
        t.push(5);
        assert_eq!(m.allocate_slots(1, &t, 1, &c, None).unwrap().len(), 3);
        assert!(m
            .allocate_slots(1, &[t.clone(), tokens(4, 9)].concat(), 4, &c, None)
            .is_none());
        assert_accounting(&m);
    }

    #[test]
    fn pinned_prefix_survives_memory_pressure() {
        let mut m = KvCacheManager::new(5, 4, "m", true);
        let corpus = tokens(8, 5);
        let c = m.get_computed_blocks(&corpus, None);
        m.allocate_slots(1, &corpus, 8, &c, None).unwrap();
        let handle = m.pin_prefix(&corpus, None).unwrap();
        assert_eq!(handle.num_tokens, 8);
        m.free(1);
        // Fill the rest of the pool with another request: the pinned blocks are not taken.
        let c = ComputedBlocks::default();
        assert!(m.allocate_slots(2, &tokens(8, 6), 8, &c, None).is_some());
        assert!(m.allocate_slots(3, &tokens(4, 7), 4, &c, None).is_none());
        m.free(2);
        let mut question = corpus.clone();
        question.extend([1, 2, 3]);
        assert_eq!(
            m.get_computed_blocks(&question, None).num_computed_tokens,
            8
        );
        m.unpin_prefix(&handle);
        assert_eq!(m.pool().num_used(), 0);
        assert!(
            m.pin_prefix(&tokens(8, 99), None).is_none(),
            "not cached: nothing to pin"
        );
    }

    #[test]
    fn prefix_caching_off_never_shares() {
        let mut m = KvCacheManager::new(9, 4, "m", false);
        let prompt = tokens(9, 8);
        let c = m.get_computed_blocks(&prompt, None);
        m.allocate_slots(1, &prompt, 9, &c, None).unwrap();
        m.free(1);
        assert_eq!(
            m.get_computed_blocks(&prompt, None),
            ComputedBlocks::default()
        );
    }
}
