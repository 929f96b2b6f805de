//! Table cases for `fl_kernels::padding` (torch side: `torch_padding.py`).

use fl_kernels::padding::{self, PackedLayout};
use fl_kernels::{f16, DeviceTensor, FloatDType, Gpu, Result};

use super::{bench_tensor, Case, Launch};

/// Seed of the bench lengths (the torch side uses the same generator and seed).
pub const SEED: u64 = 2024;

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `batch` deterministic lengths in `1..=max_len`:
/// `1 + splitmix64(seed * 1_000_003 + b) % max_len` (also in `torch_padding.py`).
pub fn bench_lengths(batch: usize, max_len: usize, seed: u64) -> Vec<i32> {
    (0..batch as u64)
        .map(|b| {
            1 + (splitmix64(seed.wrapping_mul(1_000_003).wrapping_add(b)) % max_len as u64) as i32
        })
        .collect()
}

/// Which gather a case times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// `[batch, max_len, hidden]` -> `[total, hidden]`
    Remove,
    /// `[total, hidden]` -> `[batch, max_len, hidden]`
    Rebuild,
}

/// Bytes the gather must move: every packed row read and written once, and for
/// `Rebuild` the padding rows written (as zeros).
pub fn bytes<T: FloatDType>(dir: Dir, batch: usize, max_len: usize, hidden: usize) -> u64 {
    let total: usize = bench_lengths(batch, max_len, SEED)
        .iter()
        .map(|&l| l as usize)
        .sum();
    let row = hidden * std::mem::size_of::<T>();
    let pad = match dir {
        Dir::Remove => 0,
        Dir::Rebuild => (batch * max_len - total) * row,
    };
    (2 * total * row + pad) as u64
}

/// A prepared gather with the bench lengths (layout built once, from host lengths).
pub fn prepare<T: FloatDType>(
    gpu: &Gpu,
    dir: Dir,
    batch: usize,
    max_len: usize,
    hidden: usize,
) -> Result<Launch> {
    let s = gpu.stream().clone();
    let layout =
        PackedLayout::from_host_lengths(&s, &bench_lengths(batch, max_len, SEED), max_len)?;
    let rows = layout.packed_rows();
    Ok(match dir {
        Dir::Remove => {
            let x = bench_tensor::<T>(gpu, &[batch, max_len, hidden], 21)?;
            let mut p = DeviceTensor::<T>::zeros(&s, &[rows, hidden])?;
            Box::new(move || padding::remove_padding(&s, &x, &layout, &mut p))
        }
        Dir::Rebuild => {
            let p = bench_tensor::<T>(gpu, &[rows, hidden], 22)?;
            let mut x = DeviceTensor::<T>::zeros(&s, &[batch, max_len, hidden])?;
            Box::new(move || padding::rebuild_padding(&s, &p, &layout, &mut x))
        }
    })
}

fn case<T: FloatDType>(dir: Dir, batch: usize, max_len: usize, hidden: usize) -> Case {
    Case {
        op: match dir {
            Dir::Remove => "remove_padding",
            Dir::Rebuild => "rebuild_padding",
        },
        dtype: T::NAME,
        shape: format!("b{batch}_l{max_len}_h{hidden}"),
        bytes: bytes::<T>(dir, batch, max_len, hidden),
        make: Box::new(move |gpu| prepare::<T>(gpu, dir, batch, max_len, hidden)),
    }
}

/// Both gathers at batch 64 x max_len 512 and batch 16 x max_len 2048, hidden 4096, f16.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for dir in [Dir::Remove, Dir::Rebuild] {
        for (batch, max_len) in [(64usize, 512usize), (16, 2048)] {
            v.push(case::<f16>(dir, batch, max_len, 4096));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_lengths_match_the_torch_side() {
        // Values printed by bench_lengths() of torch_padding.py.
        let l = bench_lengths(64, 512, SEED);
        assert_eq!(&l[..8], &[441, 501, 44, 476, 202, 14, 406, 351]);
        assert_eq!(l.iter().sum::<i32>(), 16630);
        let l = bench_lengths(16, 2048, SEED);
        assert_eq!(&l[..8], &[1977, 501, 1580, 2012, 202, 526, 406, 351]);
        assert_eq!(l.iter().sum::<i32>(), 13461);
        assert!(l.iter().all(|&x| (1..=2048).contains(&x)));
    }
}
