//! libgpushare_limiter.so (to be written).
