//! The model over a paged KV cache (`AttnMode::Paged`, `Cache::new_paged`) on the GPU with the
//! tiny preset's dummy weights: whatever the chunking, the block size or the order of the
//! blocks in the pool, every token's logits equal those of one static prefill of the whole
//! sequence over a contiguous cache (f32 within 1e-4: the two sides differ only in the order
//! of f32 sums; f16 within 1e-2). One paged pass mixes a prompt's first chunk, another
//! sequence's later chunk and single decode tokens; a pass of single tokens runs the decode
//! attention over the paged cache.

use fl_blas::Blas;
use fl_engine::buffers::Buffers;
use fl_engine::cache::Cache;
use fl_engine::dtype::RunDType;
use fl_engine::engine::Engine;
use fl_engine::model::{AttnMode, Model};
use fl_engine::presets::preset;
use fl_engine::weights::WeightSource;
use fl_kernels::testing::{gpu_or_skip, rel_l2, to_f64};
use fl_kernels::{f16, DeviceTensor};

#[allow(dead_code)] // this binary uses `serial` only
mod common;
use common::serial;

fn tol<T: RunDType>() -> f64 {
    if <T as fl_kernels::DType>::NAME == "f32" {
        1e-4
    } else {
        1e-2
    }
}

fn tokens(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 53 + seed * 97 + 11) % 256)
        .collect()
}

/// Logits `[m][vocab]` of every row of `buf.x` after a forward pass.
fn logits_of<T: RunDType>(model: &Model<T>, blas: &mut Blas, buf: &Buffers<T>) -> Vec<Vec<T>> {
    let s = blas.stream().clone();
    let (m, vocab) = (buf.tokens(), model.cfg.vocab_size);
    let mut logits = DeviceTensor::<T>::zeros(&s, &[m, vocab]).unwrap();
    model.lm_head(&s, blas, &buf.x, &mut logits).unwrap();
    let host = logits.to_host(&s).unwrap();
    host.chunks(vocab).map(|r| r.to_vec()).collect()
}

/// Every position's logits of one static prefill of `seq` (contiguous cache).
fn static_logits<T: RunDType>(model: &Model<T>, blas: &mut Blas, seq: &[u32]) -> Vec<Vec<T>> {
    let s = blas.stream().clone();
    let n = seq.len();
    let mut cache = Cache::<T>::new(&s, &model.cfg, 1, n).unwrap();
    let mode = AttnMode::Prefill { max_len: n };
    let mut buf = model.buffers(&s, n, &cache, mode).unwrap();
    let ids: Vec<i32> = seq.iter().map(|&t| t as i32).collect();
    let pos: Vec<i32> = (0..n as i32).collect();
    buf.upload(&s, Some(&ids), &pos, Some(&vec![0; n])).unwrap();
    buf.cu_seqlens.copy_from_host(&s, &[0, n as i32]).unwrap();
    model.forward(&s, blas, &mut buf, &mut cache, mode).unwrap();
    logits_of(model, blas, &buf)
}

/// One chunk of a paged pass: sequence `seq` (its row in `tables`) runs tokens
/// `start..start + len` of its tokens.
struct Chunk {
    seq: usize,
    start: usize,
    len: usize,
}

/// Runs `passes` over a paged cache of `num_blocks` blocks of `block` tokens, sequence `b`
/// owning the blocks `tables[b]`; returns each sequence's logits per position.
fn paged_logits<T: RunDType>(
    model: &Model<T>,
    blas: &mut Blas,
    seqs: &[Vec<u32>],
    tables: &[Vec<i32>],
    num_blocks: usize,
    block: usize,
    passes: &[Vec<Chunk>],
) -> Vec<Vec<Option<Vec<T>>>> {
    let s = blas.stream().clone();
    let width = tables.iter().map(Vec::len).max().unwrap();
    let mut cache =
        Cache::<T>::new_paged(&s, &model.cfg, num_blocks, block, seqs.len(), width).unwrap();
    let mut out: Vec<Vec<Option<Vec<T>>>> = seqs.iter().map(|q| vec![None; q.len()]).collect();
    for pass in passes {
        let m: usize = pass.iter().map(|c| c.len).sum();
        let max_q_len = pass.iter().map(|c| c.len).max().unwrap();
        // A pass of single tokens runs the decode attention over the paged cache (as the
        // runner does); others the paged prefill attention.
        let mode = if max_q_len == 1 {
            AttnMode::Decode
        } else {
            AttnMode::Paged { max_q_len }
        };
        let mut buf = model.buffers(&s, m, &cache, mode).unwrap();
        let (mut ids, mut pos, mut row) = (vec![], vec![], vec![]);
        let (mut cu, mut ctx, mut table) = (vec![0i32], vec![], vec![]);
        for (r, c) in pass.iter().enumerate() {
            ids.extend(
                seqs[c.seq][c.start..c.start + c.len]
                    .iter()
                    .map(|&t| t as i32),
            );
            pos.extend(c.start as i32..(c.start + c.len) as i32);
            row.extend(std::iter::repeat_n(r as i32, c.len));
            cu.push(ids.len() as i32);
            ctx.push((c.start + c.len) as i32);
            let mut t = tables[c.seq].clone();
            t.resize(width, -1); // past a sequence's blocks: never read
            table.extend(t);
        }
        buf.upload(&s, Some(&ids), &pos, Some(&row)).unwrap();
        buf.upload_paged(&s, &cu, &ctx, &table).unwrap();
        model.forward(&s, blas, &mut buf, &mut cache, mode).unwrap();
        let rows = logits_of(model, blas, &buf);
        let mut rows = rows.into_iter();
        for c in pass {
            for slot in &mut out[c.seq][c.start..c.start + c.len] {
                *slot = rows.next();
            }
        }
    }
    out
}

fn paged_matches_static<T: RunDType>() {
    let cfg = preset("tiny").expect("tiny preset");
    let e = Engine::<T>::load(0, cfg, WeightSource::Dummy { seed: 5 }, None).expect("load");
    let mut blas = Blas::new(e.gpu()).unwrap();
    let model = &e.model;
    // Three sequences: a 70-token prompt in chunks of 7, 20 and 40 and then 3 decode tokens; a
    // 33-token prompt in one chunk then decode tokens; a 5-token prompt decoded token by token.
    let seqs = vec![tokens(73, 1), tokens(36, 2), tokens(9, 3)];
    let block = 16;
    // Blocks taken from a pool of 24 in a scrambled order, no two sequences sharing one.
    let order: Vec<i32> = (0..24).map(|i| (i * 7 + 3) % 24).collect();
    let need: Vec<usize> = seqs.iter().map(|q| q.len().div_ceil(block)).collect();
    let mut tables = vec![];
    let mut next = 0;
    for &n in &need {
        tables.push(order[next..next + n].to_vec());
        next += n;
    }
    let c = |seq, start, len| Chunk { seq, start, len };
    let passes = vec![
        vec![c(0, 0, 7), c(1, 0, 33), c(2, 0, 5)],
        vec![c(2, 5, 1), c(0, 7, 20)],
        vec![c(1, 33, 1), c(2, 6, 1), c(0, 27, 40)],
        vec![c(0, 67, 1), c(1, 34, 1), c(2, 7, 1)],
        vec![c(0, 68, 5), c(1, 35, 1), c(2, 8, 1)],
    ];
    let paged = paged_logits(model, &mut blas, &seqs, &tables, 24, block, &passes);
    for (b, q) in seqs.iter().enumerate() {
        let want = static_logits(model, &mut blas, q);
        for (p, got) in paged[b].iter().enumerate() {
            let got = got
                .as_ref()
                .unwrap_or_else(|| panic!("seq {b} pos {p} never ran"));
            let err = rel_l2(got, &to_f64(&want[p]));
            assert!(
                err < tol::<T>(),
                "seq {b} position {p}: paged vs static rel L2 {err}"
            );
        }
    }
}

#[test]
fn paged_chunks_match_static_prefill_f32() {
    if gpu_or_skip("paged_chunks_match_static_prefill_f32").is_none() {
        return;
    }
    let _serial = serial();
    paged_matches_static::<f32>();
}

#[test]
fn paged_chunks_match_static_prefill_f16() {
    if gpu_or_skip("paged_chunks_match_static_prefill_f16").is_none() {
        return;
    }
    let _serial = serial();
    paged_matches_static::<f16>();
}

#[test]
fn paged_and_prefill_passes_need_their_cache() {
    let Some(_gpu) = gpu_or_skip("paged_and_prefill_passes_need_their_cache") else {
        return;
    };
    let _serial = serial();
    let cfg = preset("tiny").expect("tiny preset");
    let e = Engine::<f16>::load(0, cfg, WeightSource::Dummy { seed: 5 }, None).expect("load");
    let mut blas = Blas::new(e.gpu()).unwrap();
    let s = blas.stream().clone();
    let model = &e.model;
    let mut flat = Cache::<f16>::new(&s, &model.cfg, 1, 32).unwrap();
    let mode = AttnMode::Paged { max_q_len: 4 };
    let mut buf = model.buffers(&s, 4, &flat, mode).unwrap();
    let err = model
        .forward(&s, &mut blas, &mut buf, &mut flat, mode)
        .unwrap_err();
    assert!(err.to_string().contains("cache"), "{err}");
    let mut paged = Cache::<f16>::new_paged(&s, &model.cfg, 4, 16, 1, 2).unwrap();
    let mut buf = model.buffers(&s, 4, &paged, mode).unwrap();
    let err = buf.upload_paged(&s, &[0, 4], &[4], &[0]).unwrap_err();
    assert!(err.to_string().contains("block_table"), "{err}");
    let prefill = AttnMode::Prefill { max_len: 4 };
    let err = model
        .forward(&s, &mut blas, &mut buf, &mut paged, prefill)
        .unwrap_err();
    assert!(err.to_string().contains("cache"), "{err}");
    let too_long = AttnMode::Paged { max_q_len: 5 };
    let err = model
        .forward(&s, &mut blas, &mut buf, &mut paged, too_long)
        .unwrap_err();
    assert!(err.to_string().contains("max_q_len"), "{err}");
    assert!(Cache::<f16>::new_paged(&s, &model.cfg, 4, 0, 1, 2).is_err());
}
