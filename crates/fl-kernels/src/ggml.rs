//! ggml tensor types: ids, block sizes and row sizes, as GGUF files store them.
//!
//! A ggml tensor row of `k` values is stored as `k / block_elems()` consecutive blocks of
//! `block_bytes()` bytes each, little-endian, with no padding between blocks. The block
//! layouts are those of llama.cpp's `ggml-common.h`:
//!
//! | type | values | bytes | layout |
//! |---|---|---|---|
//! | F32 / F16 / BF16 | 1 | 4 / 2 / 2 | one value |
//! | Q4_0 | 32 | 18 | `f16 d; u8 qs[16]` |
//! | Q4_1 | 32 | 20 | `f16 d, m; u8 qs[16]` |
//! | Q5_0 | 32 | 22 | `f16 d; u8 qh[4]; u8 qs[16]` |
//! | Q5_1 | 32 | 24 | `f16 d, m; u8 qh[4]; u8 qs[16]` |
//! | Q8_0 | 32 | 34 | `f16 d; i8 qs[32]` |
//! | Q2_K | 256 | 84 | `u8 scales[16]; u8 qs[64]; f16 d, dmin` |
//! | Q3_K | 256 | 110 | `u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d` |
//! | Q4_K | 256 | 144 | `f16 d, dmin; u8 scales[12]; u8 qs[128]` |
//! | Q5_K | 256 | 176 | `f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]` |
//! | Q6_K | 256 | 210 | `u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d` |
//! | Q8_K | 256 | 292 | `f32 d; i8 qs[256]; i16 bsums[16]` |
//!
//! Blocks of 18, 22, 34, 110, 144, 176 and 210 bytes are only 2-byte aligned inside a row.
//! The CPU reference that dequantises each type bit-exactly as ggml does is
//! [`reference::ggml`](crate::reference::ggml).
//!
//! ```
//! use fl_kernels::ggml::GgmlType;
//! let t = GgmlType::from_id(12)?;                 // as read from a GGUF tensor info
//! assert_eq!(t, GgmlType::Q4_K);
//! assert_eq!((t.block_elems(), t.block_bytes()), (256, 144));
//! assert_eq!(t.row_bytes(4096)?, 16 * 144);
//! assert!(t.row_bytes(4000).is_err());            // not a whole number of blocks
//! # Ok::<(), fl_kernels::Error>(())
//! ```

use crate::gemv::{Q4_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES};
use crate::{Error, Result};

/// Values per block of the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0); ggml's `QK4_0` etc.
pub const QK: usize = crate::gemv::BLOCK;
/// Values per super-block of the K-quants (Q2_K ... Q8_K); ggml's `QK_K`.
pub const QK_K: usize = 256;

/// A ggml tensor type this crate knows, named as in `ggml.h` (`GGML_TYPE_Q4_K` is
/// [`GgmlType::Q4_K`]). The discriminant is ggml's type id, as stored in GGUF files.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    /// 32-bit IEEE float.
    F32 = 0,
    /// 16-bit IEEE float.
    F16 = 1,
    /// 4-bit, symmetric: `d · (q − 8)`, blocks of 32.
    Q4_0 = 2,
    /// 4-bit with a minimum: `d · q + m`, blocks of 32.
    Q4_1 = 3,
    /// 5-bit, symmetric: `d · (q − 16)`, blocks of 32.
    Q5_0 = 6,
    /// 5-bit with a minimum: `d · q + m`, blocks of 32.
    Q5_1 = 7,
    /// 8-bit, symmetric: `d · q`, blocks of 32.
    Q8_0 = 8,
    /// 2-bit K-quant: 16 sub-blocks of 16 with 4-bit scales and mins.
    Q2_K = 10,
    /// 3-bit K-quant: 16 sub-blocks of 16 with 6-bit signed scales.
    Q3_K = 11,
    /// 4-bit K-quant: 8 sub-blocks of 32 with 6-bit scales and mins.
    Q4_K = 12,
    /// 5-bit K-quant: 8 sub-blocks of 32 with 6-bit scales and mins.
    Q5_K = 13,
    /// 6-bit K-quant: 16 sub-blocks of 16 with 8-bit signed scales.
    Q6_K = 14,
    /// 8-bit K-quant with an f32 scale (ggml's intermediate format for activations).
    Q8_K = 15,
    /// bfloat16.
    BF16 = 30,
}

impl GgmlType {
    /// Every type, in id order.
    pub const ALL: [GgmlType; 14] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::BF16,
    ];

    /// The type of ggml id `id` (a GGUF tensor info's type field).
    ///
    /// Errors: [`Error::InvalidArgument`] naming `id` for an id ggml does not define or this
    /// crate does not support (e.g. 9, Q8_1, or the IQ types), with ggml's name where known.
    pub fn from_id(id: u32) -> Result<Self> {
        if let Some(t) = Self::ALL.into_iter().find(|t| t.id() == id) {
            return Ok(t);
        }
        let known = match id {
            9 => Some("q8_1"),
            16 => Some("iq2_xxs"),
            17 => Some("iq2_xs"),
            18 => Some("iq3_xxs"),
            19 => Some("iq1_s"),
            20 => Some("iq4_nl"),
            21 => Some("iq3_s"),
            22 => Some("iq2_s"),
            23 => Some("iq4_xs"),
            24 => Some("i8"),
            25 => Some("i16"),
            26 => Some("i32"),
            27 => Some("i64"),
            28 => Some("f64"),
            29 => Some("iq1_m"),
            34 => Some("tq1_0"),
            35 => Some("tq2_0"),
            39 => Some("mxfp4"),
            _ => None,
        };
        Err(Error::invalid(
            "id",
            match known {
                Some(name) => format!("ggml type {id} ({name}) is not supported"),
                None => format!("{id} is not a known ggml type id"),
            },
        ))
    }

    /// ggml's type id (`GGML_TYPE_*`).
    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name of the type (`ggml_type_name`): `f32`, `q4_0`, `q4_K`, `bf16`, ...
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q2_K => "q2_K",
            GgmlType::Q3_K => "q3_K",
            GgmlType::Q4_K => "q4_K",
            GgmlType::Q5_K => "q5_K",
            GgmlType::Q6_K => "q6_K",
            GgmlType::Q8_K => "q8_K",
            GgmlType::BF16 => "bf16",
        }
    }

    /// Whether values are stored in blocks with scales (everything but F32, F16, BF16).
    pub fn is_quantized(self) -> bool {
        !matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    }

    /// Values per block: 1 for F32 / F16 / BF16, [`QK`] = 32 for Q4_0 ... Q8_0,
    /// [`QK_K`] = 256 for the K-quants.
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
                QK
            }
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_K => QK_K,
        }
    }

    /// Bytes per block (`sizeof(block_*)` in ggml; see the [module docs](self) for layouts).
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => Q4_0_BLOCK_BYTES,
            GgmlType::Q4_1 => 2 * 2 + QK / 2,
            GgmlType::Q5_0 => 2 + 4 + QK / 2,
            GgmlType::Q5_1 => 2 * 2 + 4 + QK / 2,
            GgmlType::Q8_0 => Q8_0_BLOCK_BYTES,
            GgmlType::Q2_K => QK_K / 16 + QK_K / 4 + 2 * 2,
            GgmlType::Q3_K => QK_K / 8 + QK_K / 4 + 12 + 2,
            GgmlType::Q4_K => 2 * 2 + 12 + QK_K / 2,
            GgmlType::Q5_K => 2 * 2 + 12 + QK_K / 8 + QK_K / 2,
            GgmlType::Q6_K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
            GgmlType::Q8_K => 4 + QK_K + 2 * (QK_K / 16),
        }
    }

    /// Bytes of a row of `k` values (`ggml_row_size`).
    ///
    /// Errors: [`Error::InvalidArgument`] naming `k` if it is not a multiple of
    /// [`block_elems`](Self::block_elems); [`Error::TooLarge`] if the size overflows `usize`.
    pub fn row_bytes(self, k: usize) -> Result<usize> {
        let be = self.block_elems();
        if k % be != 0 {
            return Err(Error::invalid(
                "k",
                format!(
                    "{k} is not a multiple of the {} block of {be} values",
                    self.name()
                ),
            ));
        }
        (k / be)
            .checked_mul(self.block_bytes())
            .ok_or_else(|| Error::TooLarge {
                arg: "k",
                value: k,
                limit: (usize::MAX / self.block_bytes()).saturating_mul(be),
            })
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl TryFrom<u32> for GgmlType {
    type Error = Error;

    fn try_from(id: u32) -> Result<Self> {
        Self::from_id(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_ggml() {
        let expect = [
            (GgmlType::F32, 0, 1, 4),
            (GgmlType::F16, 1, 1, 2),
            (GgmlType::Q4_0, 2, 32, 18),
            (GgmlType::Q4_1, 3, 32, 20),
            (GgmlType::Q5_0, 6, 32, 22),
            (GgmlType::Q5_1, 7, 32, 24),
            (GgmlType::Q8_0, 8, 32, 34),
            (GgmlType::Q2_K, 10, 256, 84),
            (GgmlType::Q3_K, 11, 256, 110),
            (GgmlType::Q4_K, 12, 256, 144),
            (GgmlType::Q5_K, 13, 256, 176),
            (GgmlType::Q6_K, 14, 256, 210),
            (GgmlType::Q8_K, 15, 256, 292),
            (GgmlType::BF16, 30, 1, 2),
        ];
        assert_eq!(expect.len(), GgmlType::ALL.len());
        for (t, id, elems, bytes) in expect {
            assert_eq!(t.id(), id, "{t}");
            assert_eq!(GgmlType::from_id(id).unwrap(), t);
            assert_eq!(t.block_elems(), elems, "{t}");
            assert_eq!(t.block_bytes(), bytes, "{t}");
            assert_eq!(t.row_bytes(elems * 3).unwrap(), bytes * 3, "{t}");
            assert_eq!(t.row_bytes(0).unwrap(), 0, "{t}");
        }
    }

    #[test]
    fn errors_name_the_argument() {
        for id in [4, 5, 9, 16, 31, 1000] {
            let e = GgmlType::from_id(id).unwrap_err().to_string();
            assert!(e.contains("`id`") && e.contains(&id.to_string()), "{e}");
        }
        assert!(GgmlType::from_id(9)
            .unwrap_err()
            .to_string()
            .contains("q8_1"));
        let e = GgmlType::Q4_K.row_bytes(4000).unwrap_err().to_string();
        assert!(e.contains("`k`") && e.contains("4000"), "{e}");
        assert!(GgmlType::Q8_0.row_bytes(33).is_err());
        assert!(matches!(
            GgmlType::F32.row_bytes(usize::MAX),
            Err(Error::TooLarge { arg: "k", .. })
        ));
    }
}
