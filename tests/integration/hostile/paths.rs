//! Hostile paths: labels CSVs and manifests naming files outside the tree, symlink loops, file names with spaces, newlines or invalid UTF-8.
