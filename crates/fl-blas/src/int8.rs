//! Placeholder: INT8 W8A8 GEMM on cuBLASLt (IMMA) is being written on its own branch.
