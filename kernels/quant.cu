// Placeholder: the quant family is being written on its own branch.
#include "common/common.cuh"
