//! Fencing inside MySQL and MariaDB: the function `palisade.fence(key, token)` and its
//! Rust caller (work in progress).
