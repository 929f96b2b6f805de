//! RAII wrappers over the cuBLASLt objects this crate uses (handle, matmul descriptor,
//! matrix layouts, heuristic preference). Internal: each owns one cuBLASLt object and
//! destroys it on drop; errors are turned into [`Error::Cublas`](crate::Error::Cublas).

use std::ffi::c_void;
use std::mem::{size_of, MaybeUninit};

use cudarc::cublaslt::sys;

use crate::error::{check, Result};

/// Sets one attribute from a plain value. cuBLASLt checks `size_of::<T>()` against the
/// attribute's own size and refuses a mismatch with `CUBLAS_STATUS_INVALID_VALUE`.
macro_rules! setter {
    ($name:ident, $ty:ty, $attr_ty:ty, $f:path, $op:literal) => {
        pub(crate) fn $name<T: Copy>(&mut self, attr: $attr_ty, value: &T) -> Result<()> {
            // SAFETY: self.0 is a live object created by this wrapper; `value` points to
            // size_of::<T>() readable bytes for the duration of the call, and cuBLASLt copies
            // them (it keeps no pointer to `value`).
            let st = unsafe {
                $f(
                    self.0,
                    attr,
                    value as *const T as *const c_void,
                    size_of::<T>(),
                )
            };
            check($op, st)
        }
    };
}

/// A `cublasLtHandle_t`.
#[derive(Debug)]
pub(crate) struct Handle(pub(crate) sys::cublasLtHandle_t);

impl Handle {
    pub(crate) fn new() -> Result<Self> {
        let mut h = MaybeUninit::uninit();
        // SAFETY: cublasLtCreate writes a handle into `h` when it returns success.
        let st = unsafe { sys::cublasLtCreate(h.as_mut_ptr()) };
        check("cublasLtCreate", st)?;
        // SAFETY: initialised by the successful call above.
        Ok(Handle(unsafe { h.assume_init() }))
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtCreate and destroyed only here; a failure cannot be
        // reported from drop and leaks at most the handle.
        let _ = unsafe { sys::cublasLtDestroy(self.0) };
    }
}

/// A `cublasLtMatmulDesc_t`.
#[derive(Debug)]
pub(crate) struct MatmulDesc(pub(crate) sys::cublasLtMatmulDesc_t);

impl MatmulDesc {
    pub(crate) fn new(compute: sys::cublasComputeType_t, scale: sys::cudaDataType) -> Result<Self> {
        let mut d = MaybeUninit::uninit();
        // SAFETY: writes a descriptor into `d` on success.
        let st = unsafe { sys::cublasLtMatmulDescCreate(d.as_mut_ptr(), compute, scale) };
        check("cublasLtMatmulDescCreate", st)?;
        // SAFETY: initialised by the successful call above.
        Ok(MatmulDesc(unsafe { d.assume_init() }))
    }

    setter!(
        set,
        MatmulDesc,
        sys::cublasLtMatmulDescAttributes_t,
        sys::cublasLtMatmulDescSetAttribute,
        "cublasLtMatmulDescSetAttribute"
    );
}

impl Drop for MatmulDesc {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulDescCreate, destroyed only here.
        let _ = unsafe { sys::cublasLtMatmulDescDestroy(self.0) };
    }
}

/// A `cublasLtMatrixLayout_t` (column-major, as cuBLASLt sees it).
#[derive(Debug)]
pub(crate) struct Layout(pub(crate) sys::cublasLtMatrixLayout_t);

impl Layout {
    pub(crate) fn new(dtype: sys::cudaDataType, rows: u64, cols: u64, ld: i64) -> Result<Self> {
        let mut l = MaybeUninit::uninit();
        // SAFETY: writes a layout into `l` on success.
        let st = unsafe { sys::cublasLtMatrixLayoutCreate(l.as_mut_ptr(), dtype, rows, cols, ld) };
        check("cublasLtMatrixLayoutCreate", st)?;
        // SAFETY: initialised by the successful call above.
        Ok(Layout(unsafe { l.assume_init() }))
    }

    setter!(
        set,
        Layout,
        sys::cublasLtMatrixLayoutAttribute_t,
        sys::cublasLtMatrixLayoutSetAttribute,
        "cublasLtMatrixLayoutSetAttribute"
    );

    /// Strided batch: `count` matrices, `stride` elements apart (0: one matrix shared).
    pub(crate) fn set_batch(&mut self, count: i32, stride: i64) -> Result<()> {
        use sys::cublasLtMatrixLayoutAttribute_t as A;
        self.set(A::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count)?;
        self.set(A::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride)
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatrixLayoutCreate, destroyed only here.
        let _ = unsafe { sys::cublasLtMatrixLayoutDestroy(self.0) };
    }
}

/// A `cublasLtMatmulPreference_t`.
#[derive(Debug)]
pub(crate) struct Preference(pub(crate) sys::cublasLtMatmulPreference_t);

impl Preference {
    pub(crate) fn new() -> Result<Self> {
        let mut p = MaybeUninit::uninit();
        // SAFETY: writes a preference into `p` on success.
        let st = unsafe { sys::cublasLtMatmulPreferenceCreate(p.as_mut_ptr()) };
        check("cublasLtMatmulPreferenceCreate", st)?;
        // SAFETY: initialised by the successful call above.
        Ok(Preference(unsafe { p.assume_init() }))
    }

    setter!(
        set,
        Preference,
        sys::cublasLtMatmulPreferenceAttributes_t,
        sys::cublasLtMatmulPreferenceSetAttribute,
        "cublasLtMatmulPreferenceSetAttribute"
    );
}

impl Drop for Preference {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulPreferenceCreate, destroyed only here.
        let _ = unsafe { sys::cublasLtMatmulPreferenceDestroy(self.0) };
    }
}
