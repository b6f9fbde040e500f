//! Interruptions: SIGINT and SIGTERM stop a job within a second and leave the last complete output; SIGKILL leaves only what a rerun cleans up.
