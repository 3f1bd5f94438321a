//! Link the cdylib with `-Bsymbolic`: the library's references to its own exported wrappers
//! (the hook table, `dlsym`'s helpers) must bind to itself even when another library that
//! exports the same `cu*` names was loaded first into the global scope (e.g. when the limiter
//! is `dlopen`ed after `libcuda.so.1`, as the benchmark does).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rerun-if-changed=build.rs");
}
