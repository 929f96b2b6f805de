// Placeholder: the attention_prefill family is being written on its own branch.
#include "common/common.cuh"
