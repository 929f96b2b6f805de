//! The ggml tensor types: ids as `ggml.h` numbers them, block sizes as `ggml-common.h` lays
//! them out.

use std::fmt;

/// Super-block size of the K-quants and most IQ types (`QK_K`).
const QK_K: u64 = 256;

macro_rules! ggml_types {
    ($($(#[$doc:meta])* $v:ident = $id:literal, $name:literal, $block:expr, $bytes:expr;)*) => {
        /// A ggml tensor type (`enum ggml_type`, through `GGML_TYPE_COUNT` = 43). Ids 4, 5,
        /// 31..=33 and 36..=38 were removed from ggml and are unknown here.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType {
            $($(#[$doc])* $v = $id,)*
        }

        impl GgmlType {
            /// Every known type, by id.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$v,)*];

            /// The type with ggml id `id`, if known.
            pub fn from_id(id: u32) -> Option<Self> {
                match id {
                    $($id => Some(GgmlType::$v),)*
                    _ => None,
                }
            }

            /// The name ggml prints (`q4_K`, `f16`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $(GgmlType::$v => $name,)*
                }
            }

            /// Elements per block (1 for the plain types, 32 for Q4_0 .. Q8_1, 256 for the
            /// K-quants).
            pub fn block_size(self) -> u64 {
                match self {
                    $(GgmlType::$v => $block,)*
                }
            }

            /// Bytes per block.
            pub fn type_size(self) -> u64 {
                match self {
                    $(GgmlType::$v => $bytes,)*
                }
            }
        }
    };
}

ggml_types! {
    /// 32-bit float.
    F32 = 0, "f32", 1, 4;
    /// IEEE half.
    F16 = 1, "f16", 1, 2;
    /// `d: f16, qs[16]`.
    Q4_0 = 2, "q4_0", 32, 2 + 16;
    /// `d, m: f16, qs[16]`.
    Q4_1 = 3, "q4_1", 32, 4 + 16;
    /// `d: f16, qh[4], qs[16]`.
    Q5_0 = 6, "q5_0", 32, 2 + 4 + 16;
    /// `d, m: f16, qh[4], qs[16]`.
    Q5_1 = 7, "q5_1", 32, 4 + 4 + 16;
    /// `d: f16, qs[32]`.
    Q8_0 = 8, "q8_0", 32, 2 + 32;
    /// `d, s: f16, qs[32]`.
    Q8_1 = 9, "q8_1", 32, 4 + 32;
    /// `scales[16], qs[64], d, dmin: f16`.
    Q2_K = 10, "q2_K", QK_K, QK_K / 16 + QK_K / 4 + 4;
    /// `hmask[32], qs[64], scales[12], d: f16`.
    Q3_K = 11, "q3_K", QK_K, QK_K / 8 + QK_K / 4 + 12 + 2;
    /// `d, dmin: f16, scales[12], qs[128]`.
    Q4_K = 12, "q4_K", QK_K, 4 + 12 + QK_K / 2;
    /// `d, dmin: f16, scales[12], qh[32], qs[128]`.
    Q5_K = 13, "q5_K", QK_K, 4 + 12 + QK_K / 8 + QK_K / 2;
    /// `ql[128], qh[64], scales[16], d: f16`.
    Q6_K = 14, "q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
    /// `d: f32, qs[256], bsums[16]: i16`.
    Q8_K = 15, "q8_K", QK_K, 4 + QK_K + QK_K / 16 * 2;
    /// `d: f16, qs[32]: u16`.
    IQ2_XXS = 16, "iq2_xxs", QK_K, 2 + QK_K / 8 * 2;
    /// `d: f16, qs[32]: u16, scales[8]`.
    IQ2_XS = 17, "iq2_xs", QK_K, 2 + QK_K / 8 * 2 + QK_K / 32;
    /// `d: f16, qs[96]`.
    IQ3_XXS = 18, "iq3_xxs", QK_K, 2 + 3 * QK_K / 8;
    /// `d: f16, qs[32], qh[8]: u16`.
    IQ1_S = 19, "iq1_s", QK_K, 2 + QK_K / 8 + QK_K / 32 * 2;
    /// `d: f16, qs[16]`.
    IQ4_NL = 20, "iq4_nl", 32, 2 + 16;
    /// `d: f16, qs[64], qh[8], signs[32], scales[4]`.
    IQ3_S = 21, "iq3_s", QK_K, 2 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64;
    /// `d: f16, qs[64], qh[8], scales[8]`.
    IQ2_S = 22, "iq2_s", QK_K, 2 + QK_K / 4 + QK_K / 32 + QK_K / 32;
    /// `d: f16, scales_h: u16, scales_l[4], qs[128]`.
    IQ4_XS = 23, "iq4_xs", QK_K, 2 + 2 + QK_K / 64 + QK_K / 2;
    /// 8-bit integer.
    I8 = 24, "i8", 1, 1;
    /// 16-bit integer.
    I16 = 25, "i16", 1, 2;
    /// 32-bit integer.
    I32 = 26, "i32", 1, 4;
    /// 64-bit integer.
    I64 = 27, "i64", 1, 8;
    /// 64-bit float.
    F64 = 28, "f64", 1, 8;
    /// `qs[32], qh[16], scales[8]`.
    IQ1_M = 29, "iq1_m", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32;
    /// bfloat16.
    BF16 = 30, "bf16", 1, 2;
    /// `qs[48], qh[4], d: f16`.
    TQ1_0 = 34, "tq1_0", QK_K, (QK_K - 4 * QK_K / 64) / 5 + QK_K / 64 + 2;
    /// `qs[64], d: f16`.
    TQ2_0 = 35, "tq2_0", QK_K, QK_K / 4 + 2;
    /// `e: u8, qs[16]`.
    MXFP4 = 39, "mxfp4", 32, 1 + 16;
    /// Four E4M3 scales and 32 bytes of 4-bit values.
    NVFP4 = 40, "nvfp4", 64, 4 + 32;
    /// `d: f16`, 128 one-bit values.
    Q1_0 = 41, "q1_0", 128, 2 + 16;
    /// `d: f16`, 64 two-bit values.
    Q2_0 = 42, "q2_0", 64, 2 + 16;
}

impl GgmlType {
    /// The ggml id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Bytes of `n_elements` elements, or `None` when `n_elements` is not a whole number of
    /// blocks or the size overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        if n_elements % self.block_size() != 0 {
            return None;
        }
        (n_elements / self.block_size()).checked_mul(self.type_size())
    }

    /// Whether the type packs elements into blocks (a quantised type). Block-quant data is
    /// only as aligned as its block size allows: blocks of 18, 22, 34, 110, 210 bytes, ...
    /// start at 2-byte boundaries, so kernels must load them with 2-byte accesses (or copy).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
