//! Building pprof profiles (the `perftools.profiles` protobuf), gzipped as every pprof reader
//! expects.

mod builder;

pub use builder::{Label, LocationKey, ProfileBuilder};

/// The protobuf types, generated at build time from `proto/pprof/profile.proto`.
pub mod proto {
    #![allow(clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

use std::io::Write;

use flate2::{write::GzEncoder, Compression};
use prost::Message;

/// Encodes and gzips a profile.
pub fn encode_gzipped(profile: &proto::Profile) -> std::io::Result<Vec<u8>> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(&profile.encode_to_vec())?;
    encoder.finish()
}

/// Gunzips (if needed) and decodes a profile: the inverse of [`encode_gzipped`].
pub fn decode(bytes: &[u8]) -> Result<proto::Profile, DecodeError> {
    use std::io::Read;
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(bytes).read_to_end(&mut raw)?;
        raw
    } else {
        bytes.to_vec()
    };
    Ok(proto::Profile::decode(raw.as_slice())?)
}

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("gunzip: {0}")]
    Gzip(#[from] std::io::Error),
    #[error("protobuf: {0}")]
    Protobuf(#[from] prost::DecodeError),
}
