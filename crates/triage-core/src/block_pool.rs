//! `BlockPool`: fixed-size KV blocks with reference counts, a free queue in eviction order (least
//! recently freed first), a hash → block map for prefix caching, and pinning. Ids and counts only.

use std::collections::HashMap;

use crate::block_hash::BlockHash;

/// Index of a block in every layer's KV tensors.
pub type BlockId = u32;

/// Block 0 is never handed out: padding in block tables points at it.
pub const NULL_BLOCK: BlockId = 0;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Block {
    ref_count: u32,
    /// Set once the block is full and its contents hashed; kept while it sits in the free queue so
    /// a later request can revive it.
    hash: Option<BlockHash>,
    /// Pinned prefixes holding the block (two corpora may share leading blocks, or be the same).
    pin_count: u32,
    prev: u32,
    next: u32,
    in_free_queue: bool,
}

/// The pool of KV blocks of one model.
#[derive(Debug, Clone)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    num_free: usize,
    num_pinned: usize,
    cached: HashMap<BlockHash, BlockId>,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks, one of them the null block.
    pub fn new(num_blocks: usize) -> Self {
        let blank = Block {
            ref_count: 0,
            hash: None,
            pin_count: 0,
            prev: NIL,
            next: NIL,
            in_free_queue: false,
        };
        let mut pool = Self {
            blocks: vec![blank; num_blocks.max(1)],
            head: NIL,
            tail: NIL,
            num_free: 0,
            num_pinned: 0,
            cached: HashMap::new(),
        };
        for id in 1..pool.blocks.len() as u32 {
            pool.push_back(id);
        }
        pool
    }

    /// Blocks that can be handed out (the null block excluded).
    pub fn num_total(&self) -> usize {
        self.blocks.len() - 1
    }

    /// Blocks in the free queue (some may still hold a cached prefix).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Blocks referenced by at least one request or pinned.
    /// Blocks pinned (kept resident for a prefix), whoever else holds them.
    pub fn num_pinned(&self) -> usize {
        self.num_pinned
    }

    pub fn num_used(&self) -> usize {
        self.num_total() - self.num_free
    }

    /// Take `n` blocks from the front of the free queue, evicting their cached contents; `None`
    /// (and nothing taken) when fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.num_free {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.head;
            self.unlink(id);
            let block = &mut self.blocks[id as usize];
            if let Some(hash) = block.hash.take() {
                if self.cached.get(&hash) == Some(&id) {
                    self.cached.remove(&hash);
                }
            }
            block.ref_count = 1;
            out.push(id);
        }
        Some(out)
    }

    /// The block holding the full block with `hash`, if cached.
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        self.cached.get(&hash).copied()
    }

    /// Take one more reference to a cached block (reviving it from the free queue if needed).
    pub fn acquire(&mut self, id: BlockId) {
        if self.blocks[id as usize].in_free_queue {
            self.unlink(id);
        }
        self.blocks[id as usize].ref_count += 1;
    }

    /// Record that `id` now holds the full block with `hash`, so later requests can share it.
    pub fn cache(&mut self, id: BlockId, hash: BlockHash) {
        self.blocks[id as usize].hash = Some(hash);
        self.cached.entry(hash).or_insert(id);
    }

    /// Drop one reference to each block; blocks nobody holds join the back of the free queue, in
    /// the order given (callers pass a request's blocks tail first, so its prefix is evicted last).
    pub fn release(&mut self, ids: &[BlockId]) {
        for &id in ids {
            if id == NULL_BLOCK {
                continue;
            }
            let block = &mut self.blocks[id as usize];
            debug_assert!(block.ref_count > 0, "block {id} released twice");
            block.ref_count = block.ref_count.saturating_sub(1);
            if block.ref_count == 0 && block.pin_count == 0 {
                self.push_back(id);
            }
        }
    }

    /// Keep `id` resident even with no request holding it. Pins count: the block stays pinned
    /// until every pin is undone.
    pub fn pin(&mut self, id: BlockId) {
        if self.blocks[id as usize].in_free_queue {
            self.unlink(id);
        }
        let block = &mut self.blocks[id as usize];
        if block.pin_count == 0 {
            self.num_pinned += 1;
        }
        block.pin_count += 1;
    }

    /// Undo one [`BlockPool::pin`]; after the last, the block becomes evictable once no request
    /// holds it.
    pub fn unpin(&mut self, id: BlockId) {
        let block = &mut self.blocks[id as usize];
        if block.pin_count == 0 {
            return;
        }
        block.pin_count -= 1;
        if block.pin_count == 0 {
            let free = block.ref_count == 0;
            self.num_pinned -= 1;
            if free {
                self.push_back(id);
            }
        }
    }

    /// Whether `id` is pinned.
    pub fn is_pinned(&self, id: BlockId) -> bool {
        self.blocks[id as usize].pin_count > 0
    }

    /// References held on a block.
    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].ref_count
    }

    fn push_back(&mut self, id: BlockId) {
        let tail = self.tail;
        let block = &mut self.blocks[id as usize];
        block.prev = tail;
        block.next = NIL;
        block.in_free_queue = true;
        if tail == NIL {
            self.head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.tail = id;
        self.num_free += 1;
    }

    fn unlink(&mut self, id: BlockId) {
        let (prev, next) = {
            let b = &self.blocks[id as usize];
            (b.prev, b.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id as usize];
        b.prev = NIL;
        b.next = NIL;
        b.in_free_queue = false;
        self.num_free -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_hash::hash_block;

    #[test]
    fn allocation_counts_add_up_and_null_block_is_never_handed_out() {
        let mut pool = BlockPool::new(9);
        assert_eq!(pool.num_total(), 8);
        let a = pool.allocate(5).unwrap();
        assert!(!a.contains(&NULL_BLOCK));
        assert_eq!((pool.num_free(), pool.num_used()), (3, 5));
        assert!(pool.allocate(4).is_none(), "too few free blocks");
        assert_eq!(pool.num_free(), 3, "a failed allocation takes nothing");
        pool.release(&a);
        assert_eq!((pool.num_free(), pool.num_used()), (8, 0));
    }

    #[test]
    fn free_queue_evicts_least_recently_freed_first() {
        let mut pool = BlockPool::new(5);
        let a = pool.allocate(4).unwrap();
        pool.release(&[a[2], a[0], a[3], a[1]]);
        assert_eq!(pool.allocate(4).unwrap(), vec![a[2], a[0], a[3], a[1]]);
    }

    #[test]
    fn cached_blocks_are_revived_until_evicted() {
        let mut pool = BlockPool::new(3);
        let h = hash_block(None, &[1, 2, 3, 4], "m", None);
        let a = pool.allocate(1).unwrap()[0];
        pool.cache(a, h);
        pool.release(&[a]);
        assert_eq!(pool.lookup(h), Some(a), "freed but still cached");
        pool.acquire(a);
        assert_eq!((pool.ref_count(a), pool.num_free()), (1, 1));
        pool.release(&[a]);
        let both = pool.allocate(2).unwrap();
        assert!(both.contains(&a));
        assert_eq!(pool.lookup(h), None, "reuse evicts the cached contents");
    }

    #[test]
    fn pinned_blocks_are_never_evicted() {
        let mut pool = BlockPool::new(4);
        let a = pool.allocate(1).unwrap()[0];
        pool.pin(a);
        pool.release(&[a]);
        assert_eq!(pool.num_free(), 2);
        let rest = pool.allocate(2).unwrap();
        assert!(!rest.contains(&a));
        assert!(pool.allocate(1).is_none());
        pool.unpin(a);
        assert_eq!(pool.allocate(1).unwrap(), vec![a]);
    }

    /// Two corpora sharing leading blocks pin them twice: unpinning one keeps them resident
    /// for the other.
    #[test]
    fn a_block_stays_pinned_until_its_last_pin_is_undone() {
        // A pool of two usable blocks, one of them pinned twice and held by no request.
        let twice_pinned = || {
            let mut pool = BlockPool::new(3);
            let a = pool.allocate(1).unwrap()[0];
            pool.pin(a);
            pool.pin(a);
            pool.release(&[a]);
            (pool, a)
        };
        let (mut pool, a) = twice_pinned();
        pool.unpin(a);
        assert!(pool.is_pinned(a));
        assert_eq!((pool.num_pinned(), pool.num_free()), (1, 1));
        assert!(!pool.allocate(2).is_some_and(|b| b.contains(&a)));
        let (mut pool, a) = twice_pinned();
        pool.unpin(a);
        pool.unpin(a);
        pool.unpin(a);
        assert_eq!(
            (pool.num_pinned(), pool.num_free()),
            (0, 2),
            "extra unpins are no-ops"
        );
    }

    #[test]
    fn shared_block_frees_after_last_reference() {
        let mut pool = BlockPool::new(2);
        let a = pool.allocate(1).unwrap()[0];
        pool.acquire(a);
        pool.release(&[a]);
        assert_eq!(pool.num_free(), 0);
        pool.release(&[a]);
        assert_eq!(pool.num_free(), 1);
    }
}
