//! Every write can fail: disk full, read-only folder, an output path that is a file, at each stage; one line naming the path and the cause.
