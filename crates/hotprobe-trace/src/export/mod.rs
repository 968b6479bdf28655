//! Exporters to formats existing tools open.

mod chrome;
mod ctf;
#[cfg(feature = "flamegraph")]
mod flame;
mod folded;
#[cfg(feature = "otlp")]
mod otlp;
#[cfg(feature = "otlp")]
mod otlp_http;
#[cfg(feature = "parquet")]
mod parquet;

pub use chrome::{export_chrome, export_chrome_filtered, value_string, ChromeStats};
pub use ctf::{export_ctf, export_ctf_filtered, CtfStats};
#[cfg(feature = "flamegraph")]
pub use flame::{draw_flamegraph, export_flamegraph, FlameOptions, FlameStats};
pub use folded::{
    export_folded, export_folded_filtered, folded_stacks, FoldedOptions, FoldedValue,
};
#[cfg(feature = "otlp")]
pub use otlp::{export_otlp, OtlpOptions, OtlpSignal, OtlpStats};
#[cfg(feature = "otlp")]
pub use otlp_http::{OtlpEndpoint, OtlpEndpointError, OTLP_HTTP_PORT};
#[cfg(feature = "parquet")]
pub use parquet::{export_parquet, ParquetStats};
