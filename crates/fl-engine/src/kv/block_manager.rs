//! [`BlockManager`]: the pool, the block tables, reference counts, copy-on-write, prefix cache.

use std::collections::{BTreeMap, HashMap};

use super::{block_hash, blocks_needed, invalid, BlockId, KvError, SeqId, ROOT_HASH};

/// One block's bookkeeping.
#[derive(Clone, Debug, Default)]
struct Block {
    /// Number of block tables naming this block.
    ref_count: u32,
    /// Prefix-cache entry: (hash, parent hash, token ids) while registered.
    cached: Option<CachedKey>,
    /// Position in the LRU list while the block is cached and unreferenced.
    lru_stamp: Option<u64>,
}

#[derive(Clone, Debug)]
struct CachedKey {
    hash: u64,
    parent: u64,
    tokens: Box<[u32]>,
}

/// One sequence's view of the pool.
#[derive(Clone, Debug)]
struct SeqBlocks {
    table: Vec<BlockId>,
    /// Token slots reserved (the table covers `blocks_needed(num_tokens)` blocks).
    num_tokens: usize,
    /// Leading full blocks whose chained hash is known (registered or found in the cache).
    num_hashed: usize,
    /// Hash of block `num_hashed - 1` (or [`ROOT_HASH`]).
    last_hash: u64,
}

/// A block copy the runner performs on the GPU before the step's KV writes: slots
/// `0..n_tokens` of every layer's K and V, from block `src` to block `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CowCopy {
    /// Block read.
    pub src: BlockId,
    /// Block written (freshly allocated, owned by the appending sequence alone).
    pub dst: BlockId,
    /// Leading slots to copy.
    pub n_tokens: usize,
}

/// What [`BlockManager::allocate_prompt`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Leading prompt tokens whose KV is already in the cache (whole blocks; at most
    /// `prompt_len - 1`). The sequence starts computing at this position.
    pub num_cached_tokens: usize,
    /// Tokens after the cached ones that now have slots (`min(prompt_len - cached, budget)`).
    pub num_new_tokens: usize,
}

/// Pool usage for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvStats {
    /// Blocks in the pool.
    pub total_blocks: usize,
    /// Blocks named by at least one block table.
    pub used_blocks: usize,
    /// Blocks free to allocate (never-cached plus evictable cached ones).
    pub free_blocks: usize,
    /// Blocks registered in the prefix cache (used or free).
    pub cached_blocks: usize,
    /// Of the free blocks, those still holding a prefix-cache entry.
    pub cached_free_blocks: usize,
    /// Prompt tokens looked up in the prefix cache (successful allocations).
    pub prefix_query_tokens: u64,
    /// Of those, tokens found in the cache.
    pub prefix_hit_tokens: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
}

/// The paged KV pool's bookkeeping. See the [module docs](super) for the design.
///
/// Life of a sequence: [`allocate_prompt`](Self::allocate_prompt) (attaches prefix-cache hits
/// and reserves slots for the first chunk), [`append_slots`](Self::append_slots) for every
/// further chunk or decode token, [`cache_full_blocks`](Self::cache_full_blocks) once a step has
/// computed KV (registers the newly full blocks in the prefix cache),
/// [`fork`](Self::fork) to share it with a child, [`free`](Self::free) at the end.
#[derive(Clone, Debug)]
pub struct BlockManager {
    block_size: usize,
    enable_prefix_cache: bool,
    blocks: Vec<Block>,
    /// Free blocks without a cache entry (taken first; a stack).
    free_plain: Vec<BlockId>,
    /// Free blocks with a cache entry, oldest stamp evicted first.
    lru: BTreeMap<u64, BlockId>,
    next_stamp: u64,
    /// Prefix cache: chained hash -> block.
    cache: HashMap<u64, BlockId>,
    seqs: HashMap<SeqId, SeqBlocks>,
    prefix_query_tokens: u64,
    prefix_hit_tokens: u64,
    evictions: u64,
}

impl BlockManager {
    /// A pool of `num_blocks` blocks of `block_size` token slots. Both must be non-zero and
    /// `num_blocks` at most `u32::MAX`.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        enable_prefix_cache: bool,
    ) -> Result<Self, KvError> {
        if block_size == 0 {
            return Err(invalid("block_size", "must be > 0"));
        }
        if num_blocks == 0 || num_blocks > u32::MAX as usize {
            return Err(invalid(
                "num_blocks",
                format!("{num_blocks} is not in 1..=u32::MAX"),
            ));
        }
        Ok(Self {
            block_size,
            enable_prefix_cache,
            blocks: vec![Block::default(); num_blocks],
            // Reversed so that block 0 is handed out first.
            free_plain: (0..num_blocks as BlockId).rev().collect(),
            lru: BTreeMap::new(),
            next_stamp: 0,
            cache: HashMap::new(),
            seqs: HashMap::new(),
            prefix_query_tokens: 0,
            prefix_hit_tokens: 0,
            evictions: 0,
        })
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Whether full blocks are registered and looked up.
    pub fn prefix_cache_enabled(&self) -> bool {
        self.enable_prefix_cache
    }

    /// Blocks free to allocate: never-cached ones plus cached ones with no reference (evicted on
    /// demand).
    pub fn num_free_blocks(&self) -> usize {
        self.free_plain.len() + self.lru.len()
    }

    /// Whether `n_blocks` fresh blocks can be allocated now.
    pub fn can_allocate(&self, n_blocks: usize) -> bool {
        n_blocks <= self.num_free_blocks()
    }

    /// Whether `seq` holds blocks.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// The block table of `seq`: token `p` is in slot `p % block_size` of `table[p / block_size]`.
    pub fn block_table(&self, seq: SeqId) -> Result<&[BlockId], KvError> {
        Ok(&self.seq(seq)?.table)
    }

    /// Token slots reserved for `seq`.
    pub fn num_tokens(&self, seq: SeqId) -> Result<usize, KvError> {
        Ok(self.seq(seq)?.num_tokens)
    }

    /// The reference count of `block` (0 for an id outside the pool).
    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.blocks.get(block as usize).map_or(0, |b| b.ref_count)
    }

    /// Usage for metrics.
    pub fn stats(&self) -> KvStats {
        KvStats {
            total_blocks: self.blocks.len(),
            used_blocks: self.blocks.len() - self.num_free_blocks(),
            free_blocks: self.num_free_blocks(),
            cached_blocks: self.cache.len(),
            cached_free_blocks: self.lru.len(),
            prefix_query_tokens: self.prefix_query_tokens,
            prefix_hit_tokens: self.prefix_hit_tokens,
            evictions: self.evictions,
        }
    }

    /// Leading tokens of `tokens` found in the prefix cache: whole blocks, at most
    /// `tokens.len() - 1` (0 when the cache is off). Changes nothing.
    pub fn cached_prefix_len(&self, tokens: &[u32]) -> usize {
        self.lookup(tokens).len() * self.block_size
    }

    /// Starts sequence `seq` on `prompt`: attaches the prefix-cache hit and reserves slots for
    /// up to `budget` further tokens (the first prefill chunk). `budget` must be at least 1 and
    /// `prompt` non-empty. On [`KvError::NoSpace`] nothing changes.
    pub fn allocate_prompt(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        budget: usize,
    ) -> Result<Allocation, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::SequenceExists(seq));
        }
        if prompt.is_empty() {
            return Err(invalid("prompt", "is empty"));
        }
        if budget == 0 {
            return Err(invalid("budget", "must be > 0"));
        }
        let hits = self.lookup(prompt);
        let num_cached = hits.len() * self.block_size;
        let num_new = (prompt.len() - num_cached).min(budget);
        let fresh = blocks_needed(num_cached + num_new, self.block_size) - hits.len();
        // Hits with no reference sit in the free count; reviving them uses it up.
        let revived = hits
            .iter()
            .filter(|&&b| self.blocks[b as usize].ref_count == 0)
            .count();
        if fresh + revived > self.num_free_blocks() {
            return Err(KvError::NoSpace {
                needed: fresh + revived,
                free: self.num_free_blocks(),
            });
        }
        let mut table = Vec::with_capacity(hits.len() + fresh);
        for &b in &hits {
            self.take_ref(b);
            table.push(b);
        }
        for _ in 0..fresh {
            table.push(self.pop_free());
        }
        let last_hash = hits
            .last()
            .and_then(|&b| self.blocks[b as usize].cached.as_ref())
            .map_or(ROOT_HASH, |k| k.hash);
        self.seqs.insert(
            seq,
            SeqBlocks {
                table,
                num_tokens: num_cached + num_new,
                num_hashed: hits.len(),
                last_hash,
            },
        );
        if self.enable_prefix_cache {
            self.prefix_query_tokens += prompt.len() as u64;
            self.prefix_hit_tokens += num_cached as u64;
        }
        Ok(Allocation {
            num_cached_tokens: num_cached,
            num_new_tokens: num_new,
        })
    }

    /// Free blocks [`append_slots`](Self::append_slots)`(seq, n_new_tokens)` would take now
    /// (new blocks, plus one for a copy-on-write of a shared partial last block).
    pub fn append_need(&self, seq: SeqId, n_new_tokens: usize) -> Result<usize, KvError> {
        let bs = self.block_size;
        let s = self.seq(seq)?;
        if n_new_tokens == 0 {
            return Ok(0);
        }
        let cow = s.num_tokens % bs != 0
            && s.table
                .last()
                .is_some_and(|&b| self.blocks[b as usize].ref_count > 1);
        Ok(blocks_needed(s.num_tokens + n_new_tokens, bs) - s.table.len() + cow as usize)
    }

    /// Free blocks that [`append_slots`](Self::append_slots) takes for each `(seq, n)` of
    /// `appends` in that order: a partial block shared by several of them is copied for all
    /// but the last one to move (its count is 1 by then).
    pub fn append_need_all(&self, appends: &[(SeqId, usize)]) -> Result<usize, KvError> {
        let bs = self.block_size;
        let mut moved: HashMap<BlockId, u32> = HashMap::new();
        let mut need = 0;
        for &(seq, n) in appends {
            let s = self.seq(seq)?;
            if n == 0 {
                continue;
            }
            if let Some(&last) = s.table.last().filter(|_| s.num_tokens % bs != 0) {
                let left = self.blocks[last as usize].ref_count - moved.get(&last).unwrap_or(&0);
                if left > 1 {
                    need += 1;
                    *moved.entry(last).or_default() += 1;
                }
            }
            need += blocks_needed(s.num_tokens + n, bs) - s.table.len();
        }
        Ok(need)
    }

    /// Reserves slots for `n_new_tokens` more tokens of `seq`. If the last block is partial and
    /// shared (after [`fork`](Self::fork)), the sequence first moves to a fresh copy of it: the
    /// returned [`CowCopy`] must run on the GPU before this step writes KV. On
    /// [`KvError::NoSpace`] nothing changes.
    pub fn append_slots(
        &mut self,
        seq: SeqId,
        n_new_tokens: usize,
    ) -> Result<Vec<CowCopy>, KvError> {
        let bs = self.block_size;
        let s = self.seq(seq)?;
        if n_new_tokens == 0 {
            return Ok(Vec::new());
        }
        let filled = s.num_tokens % bs;
        let cow = filled != 0
            && s.table
                .last()
                .is_some_and(|&b| self.blocks[b as usize].ref_count > 1);
        let grow = blocks_needed(s.num_tokens + n_new_tokens, bs) - s.table.len();
        let needed = grow + cow as usize;
        if needed > self.num_free_blocks() {
            return Err(KvError::NoSpace {
                needed,
                free: self.num_free_blocks(),
            });
        }
        let mut copies = Vec::new();
        if cow {
            let dst = self.pop_free();
            let s = self.seqs.get_mut(&seq).expect("checked above");
            let last = s.table.len() - 1;
            let src = std::mem::replace(&mut s.table[last], dst);
            // Shared, so the count stays above 0.
            self.blocks[src as usize].ref_count -= 1;
            copies.push(CowCopy {
                src,
                dst,
                n_tokens: filled,
            });
        }
        let fresh: Vec<BlockId> = (0..grow).map(|_| self.pop_free()).collect();
        let s = self.seqs.get_mut(&seq).expect("checked above");
        s.table.extend(fresh);
        s.num_tokens += n_new_tokens;
        Ok(copies)
    }

    /// Registers in the prefix cache every full block of `seq` within its first `num_computed`
    /// tokens not registered yet; `tokens` are the sequence's token ids (at least
    /// `num_computed` of them). Call it after the step that computed their KV, never before:
    /// another sequence may reuse a registered block at once. A block whose content is already
    /// cached elsewhere stays unregistered (the chain continues). No-op when the cache is off.
    pub fn cache_full_blocks(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        num_computed: usize,
    ) -> Result<(), KvError> {
        let bs = self.block_size;
        let s = self.seq(seq)?;
        if num_computed > s.num_tokens {
            return Err(invalid(
                "num_computed",
                format!("{num_computed} > {} reserved slots", s.num_tokens),
            ));
        }
        if tokens.len() < num_computed {
            return Err(invalid(
                "tokens",
                format!("{} ids for {num_computed} computed tokens", tokens.len()),
            ));
        }
        if !self.enable_prefix_cache {
            return Ok(());
        }
        let full = num_computed / bs;
        let (start, mut parent) = (s.num_hashed, s.last_hash);
        for i in start..full {
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let h = block_hash(parent, chunk);
            let b = self.seqs[&seq].table[i];
            let block = &mut self.blocks[b as usize];
            if block.cached.is_none() && !self.cache.contains_key(&h) {
                block.cached = Some(CachedKey {
                    hash: h,
                    parent,
                    tokens: chunk.into(),
                });
                self.cache.insert(h, b);
            }
            parent = h;
        }
        let s = self.seqs.get_mut(&seq).expect("checked above");
        if full > s.num_hashed {
            s.num_hashed = full;
            s.last_hash = parent;
        }
        Ok(())
    }

    /// Starts `child` as a copy of `parent`: the same block table, every count incremented.
    /// Later appends into a shared partial block copy it first ([`append_slots`](Self::append_slots)).
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), KvError> {
        if self.seqs.contains_key(&child) {
            return Err(KvError::SequenceExists(child));
        }
        let s = self.seq(parent)?.clone();
        for &b in &s.table {
            self.blocks[b as usize].ref_count += 1;
        }
        self.seqs.insert(child, s);
        Ok(())
    }

    /// Ends `seq`: drops its references, last block first (so a prompt's tail is evicted before
    /// its head). Returns the blocks whose count reached 0; registered ones stay in the prefix
    /// cache until evicted.
    pub fn free(&mut self, seq: SeqId) -> Result<Vec<BlockId>, KvError> {
        let s = self
            .seqs
            .remove(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let mut released = Vec::new();
        for &b in s.table.iter().rev() {
            let block = &mut self.blocks[b as usize];
            block.ref_count -= 1;
            if block.ref_count == 0 {
                released.push(b);
                if block.cached.is_some() {
                    block.lru_stamp = Some(self.next_stamp);
                    self.lru.insert(self.next_stamp, b);
                    self.next_stamp += 1;
                } else {
                    self.free_plain.push(b);
                }
            }
        }
        Ok(released)
    }

    /// Checks every invariant of the pool (for tests and debug builds): counts equal the
    /// number of tables naming each block; free blocks are exactly those with count 0, each on
    /// one list; the cache map and the blocks' keys agree; every table covers its tokens.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut refs = vec![0u32; self.blocks.len()];
        for (id, s) in &self.seqs {
            if s.table.len() != blocks_needed(s.num_tokens, self.block_size) {
                return Err(format!(
                    "seq {id}: {} blocks for {} tokens",
                    s.table.len(),
                    s.num_tokens
                ));
            }
            for &b in &s.table {
                *refs
                    .get_mut(b as usize)
                    .ok_or(format!("seq {id}: block {b} out of range"))? += 1;
            }
        }
        let mut on_list = vec![0u8; self.blocks.len()];
        for &b in self.free_plain.iter().chain(self.lru.values()) {
            on_list[b as usize] += 1;
        }
        for (i, b) in self.blocks.iter().enumerate() {
            if b.ref_count != refs[i] {
                return Err(format!(
                    "block {i}: ref_count {} but {} tables",
                    b.ref_count, refs[i]
                ));
            }
            let want = (b.ref_count == 0) as u8;
            if on_list[i] != want {
                return Err(format!(
                    "block {i}: rc {} on {} free lists",
                    b.ref_count, on_list[i]
                ));
            }
            if b.lru_stamp.is_some() != (b.ref_count == 0 && b.cached.is_some()) {
                return Err(format!("block {i}: LRU stamp disagrees with rc/cache"));
            }
            if let Some(k) = &b.cached {
                if self.cache.get(&k.hash) != Some(&(i as BlockId)) {
                    return Err(format!("block {i}: cached key not in the map"));
                }
            }
        }
        for (&h, &b) in &self.cache {
            if self.blocks[b as usize].cached.as_ref().map(|k| k.hash) != Some(h) {
                return Err(format!("cache entry {h:#x} -> block {b} not keyed so"));
            }
        }
        for (&stamp, &b) in &self.lru {
            if self.blocks[b as usize].lru_stamp != Some(stamp) {
                return Err(format!("LRU stamp {stamp} -> block {b} disagrees"));
            }
        }
        if self.stats().used_blocks + self.num_free_blocks() != self.blocks.len() {
            return Err("used + free != total".into());
        }
        Ok(())
    }

    fn seq(&self, seq: SeqId) -> Result<&SeqBlocks, KvError> {
        self.seqs.get(&seq).ok_or(KvError::UnknownSequence(seq))
    }

    /// The cached blocks matching `tokens`' leading full blocks, at most `len - 1` tokens.
    fn lookup(&self, tokens: &[u32]) -> Vec<BlockId> {
        let mut hits = Vec::new();
        if !self.enable_prefix_cache || tokens.is_empty() {
            return hits;
        }
        let max_blocks = (tokens.len() - 1) / self.block_size;
        let mut parent = ROOT_HASH;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let h = block_hash(parent, chunk);
            let Some(&b) = self.cache.get(&h) else { break };
            let same = self.blocks[b as usize]
                .cached
                .as_ref()
                .is_some_and(|k| k.parent == parent && *k.tokens == *chunk);
            if !same {
                break;
            }
            hits.push(b);
            parent = h;
        }
        hits
    }

    /// Adds a reference to a cached block, reviving it from the LRU list if needed.
    fn take_ref(&mut self, b: BlockId) {
        let block = &mut self.blocks[b as usize];
        if let Some(stamp) = block.lru_stamp.take() {
            self.lru.remove(&stamp);
        }
        block.ref_count += 1;
    }

    /// Takes a free block (never-cached first, else evicts the least recently freed cached
    /// one) with count 1. Callers check the free count first.
    fn pop_free(&mut self) -> BlockId {
        let b = match self.free_plain.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.lru.pop_first().expect("caller checked the free count");
                let block = &mut self.blocks[b as usize];
                block.lru_stamp = None;
                if let Some(k) = block.cached.take() {
                    self.cache.remove(&k.hash);
                }
                self.evictions += 1;
                b
            }
        };
        self.blocks[b as usize].ref_count = 1;
        b
    }
}
