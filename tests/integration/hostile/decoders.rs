//! Inputs kept from fuzzing the convert decoders: each once made a decoder panic, hang or over-allocate.
