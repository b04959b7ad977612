//! Empty on purpose: the library target lets the daemon declare a build-dependency on this
//! crate, so cargo rebuilds the daemon (and with it the embedded object) when this crate changes.
#![no_std]
