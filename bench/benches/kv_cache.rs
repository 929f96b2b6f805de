//! KV-cache append of K, V [tokens, 8, 128] f16 into a contiguous cache (`fl_contiguous`) and
//! a paged one with 16-slot blocks (`fl_paged`), next to a device copy of the same traffic
//! (bytes = K and V read once and written once, plus the slot indices).
//!
//! `rope_append_f16`: the fused QKV split + RoPE + append (`fused`) against `rope::apply` +
//! `kv_cache::append` (`unfused`, on q and k already split, as the engine did) for the 7B
//! (32/32 heads) and Llama-3-8B (32/8) shapes, head_dim 128, contiguous cache, at 1, 16, 64
//! (decode) and 4096 tokens; bytes = qkv read + q, k, v written + slot indices.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fl_bench::ops::kv_cache::{layout, Layout};
use fl_bench::{gpu_or_skip, time_on_device, CopyProbe};
use fl_kernels::kv_cache::{self, CacheLayout, KvCache, QkvSplit, RopeAppend, TokenSlots};
use fl_kernels::rope::{self, RopeParams};
use fl_kernels::{f16, DeviceTensor};

const KV_HEADS: usize = 8;
const HEAD_DIM: usize = 128;
const BLOCK: usize = 16;

fn benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("kv_cache") else {
        return;
    };
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group("kv_append_f16");
    for &t in &[1usize, 64, 4096, 65_536] {
        let Layout {
            batch,
            max_seq,
            seq,
            pos,
            table,
            num_blocks,
        } = layout(t, BLOCK);
        let k = DeviceTensor::filled(&s, &[t, KV_HEADS, HEAD_DIM], f16::from_f32(0.5)).unwrap();
        let v = DeviceTensor::filled(&s, &[t, KV_HEADS, HEAD_DIM], f16::from_f32(0.25)).unwrap();
        let seq = DeviceTensor::from_host(&s, &seq, &[t]).unwrap();
        let pos = DeviceTensor::from_host(&s, &pos, &[t]).unwrap();
        let slots = TokenSlots {
            seq_ids: &seq,
            positions: &pos,
        };
        let bytes = 2 * t * KV_HEADS * HEAD_DIM * 4 + 8 * t;
        g.throughput(Throughput::Bytes(bytes as u64));
        {
            let mut cache =
                KvCache::<f16>::zeros(&s, [batch, KV_HEADS, max_seq, HEAD_DIM]).unwrap();
            g.bench_with_input(BenchmarkId::new("fl_contiguous", t), &t, |b, _| {
                b.iter_custom(|it| {
                    time_on_device(&s, it, || {
                        kv_cache::append(&s, &k, &v, &slots, &mut cache, None)
                    })
                })
            });
        }
        {
            let mut cache =
                KvCache::<f16>::zeros(&s, [num_blocks, KV_HEADS, BLOCK, HEAD_DIM]).unwrap();
            let table = DeviceTensor::from_host(&s, &table, &[batch, max_seq / BLOCK]).unwrap();
            g.bench_with_input(BenchmarkId::new("fl_paged", t), &t, |b, _| {
                b.iter_custom(|it| {
                    time_on_device(&s, it, || {
                        kv_cache::append_paged(&s, &k, &v, &slots, &table, &mut cache, None)
                    })
                })
            });
        }
        let mut cp = CopyProbe::new(&gpu, bytes / 2).unwrap();
        g.bench_with_input(BenchmarkId::new("copy", t), &t, |b, _| {
            b.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
        });
    }
    g.finish();
}

fn rope_append_benches(c: &mut Criterion) {
    let Some(gpu) = gpu_or_skip("kv_cache rope_append") else {
        return;
    };
    let s = gpu.stream().clone();
    let mut g = c.benchmark_group("rope_append_f16");
    let rope = RopeParams::new(HEAD_DIM, 500_000.0);
    for (name, hq, hkv) in [("7b", 32usize, 32usize), ("llama3_8b", 32, 8)] {
        for &t in &[1usize, 16, 64, 4096] {
            let Layout {
                batch,
                max_seq,
                seq,
                pos,
                ..
            } = layout(t, BLOCK);
            let width = (hq + 2 * hkv) * HEAD_DIM;
            let qkv = DeviceTensor::filled(&s, &[t, width], f16::from_f32(0.5)).unwrap();
            let seq = DeviceTensor::from_host(&s, &seq, &[t]).unwrap();
            let pos = DeviceTensor::from_host(&s, &pos, &[t]).unwrap();
            let slots = TokenSlots {
                seq_ids: &seq,
                positions: &pos,
            };
            let mut q = DeviceTensor::<f16>::zeros(&s, &[t, hq, HEAD_DIM]).unwrap();
            let mut k = DeviceTensor::filled(&s, &[t, hkv, HEAD_DIM], f16::from_f32(0.5)).unwrap();
            let v = DeviceTensor::filled(&s, &[t, hkv, HEAD_DIM], f16::from_f32(0.25)).unwrap();
            let mut cache = KvCache::<f16>::zeros(&s, [batch, hkv, max_seq, HEAD_DIM]).unwrap();
            let bytes = 2 * t * width * 2 + 8 * t;
            g.throughput(Throughput::Bytes(bytes as u64));
            let args = RopeAppend {
                qkv: &qkv,
                heads: QkvSplit {
                    q_heads: hq,
                    kv_heads: hkv,
                },
                slots,
                rope: &rope,
                layout: CacheLayout::Contiguous,
            };
            let id = format!("{name}_t{t}");
            g.bench_with_input(BenchmarkId::new("fused", &id), &t, |b, _| {
                b.iter_custom(|it| {
                    time_on_device(&s, it, || {
                        kv_cache::rope_append(&s, &args, &mut q, None, &mut cache, None)
                    })
                })
            });
            g.bench_with_input(BenchmarkId::new("unfused", &id), &t, |b, _| {
                b.iter_custom(|it| {
                    time_on_device(&s, it, || {
                        rope::apply(&s, &mut q, &mut k, &pos, &rope, None)?;
                        kv_cache::append(&s, &k, &v, &slots, &mut cache, None)
                    })
                })
            });
            let mut cp = CopyProbe::new(&gpu, bytes / 2).unwrap();
            g.bench_with_input(BenchmarkId::new("copy", &id), &t, |b, _| {
                b.iter_custom(|it| time_on_device(&s, it, || cp.copy(&s)))
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = group;
    config = Criterion::default().sample_size(10).warm_up_time(std::time::Duration::from_millis(200))
        .measurement_time(std::time::Duration::from_millis(600));
    targets = benches, rope_append_benches
}
criterion_main!(group);
