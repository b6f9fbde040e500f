//! One integration-test binary for the whole tool: the CLI as a user runs it, and the library where
//! a test needs to reach inside files.

mod colmajor;
mod colmajor_input;
mod convert;
mod corruption;
mod fashion;
mod fields;
mod fields_csv;
mod fields_msd;
mod fields_npy;
mod fields_tree;
mod fixtures;
mod float;
mod hostile;
mod inspect;
mod layers;
mod newcomer;
mod newcomer_b;
mod newcomer_c;
mod npy;
mod parts;
mod ranks;
mod scans;
mod scans_series;
mod scans_volumes;
mod servers;
mod splits;
mod stores;
mod synth;
mod synth_task;
mod tasks;
mod tiff;
mod train;
mod trees;
mod util;
mod video;
