//! Element types that device tensors may hold.

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use fl_kernels_sys::fl_dtype;
use half::{bf16, f16};

mod sealed {
    pub trait Sealed {}
}

/// An element type of a [`DeviceTensor`](crate::DeviceTensor): `f32`, `f16`, `bf16`, `i8`,
/// `i32` or `u8` (packed 4-bit values use `u8`). Sealed: the kernels know only these.
pub trait DType:
    sealed::Sealed + DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + 'static
{
    /// The C ABI tag of this type.
    const ID: fl_dtype;
    /// Short name, as in error messages and bench ids ("f16", ...).
    const NAME: &'static str;
}

/// A floating-point [`DType`] (`f32`, `f16`, `bf16`); kernels compute in f32.
pub trait FloatDType: DType + PartialOrd {
    /// Convert to f32 (exact).
    fn to_f32(self) -> f32;
    /// Convert from f32, rounding to nearest even.
    fn from_f32(x: f32) -> Self;
    /// Convert to f64 (exact).
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    /// Unit roundoff of this type (2^-24, 2^-11, 2^-8).
    const EPS: f64;
}

macro_rules! dtype {
    ($t:ty, $id:ident, $name:literal) => {
        impl sealed::Sealed for $t {}
        impl DType for $t {
            const ID: fl_dtype = fl_dtype::$id;
            const NAME: &'static str = $name;
        }
    };
}
dtype!(f32, FL_DTYPE_F32, "f32");
dtype!(f16, FL_DTYPE_F16, "f16");
dtype!(bf16, FL_DTYPE_BF16, "bf16");
dtype!(i8, FL_DTYPE_I8, "i8");
dtype!(i32, FL_DTYPE_I32, "i32");
dtype!(u8, FL_DTYPE_U8, "u8");

impl FloatDType for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
    const EPS: f64 = 5.960_464_477_539_063e-8;
}
impl FloatDType for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    const EPS: f64 = 4.882_812_5e-4;
}
impl FloatDType for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    const EPS: f64 = 3.906_25e-3;
}

/// A 16-bit float [`DType`] (`f16`, `bf16`): the types of the kernels that run on tensor
/// cores only (dense and quantised GEMV, the W8A8 activation kernels).
pub trait HalfDType: FloatDType {}
impl HalfDType for f16 {}
impl HalfDType for bf16 {}
