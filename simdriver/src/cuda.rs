//! TEST-ONLY: CUDA half (to be written).
