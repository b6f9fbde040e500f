//! Opening what must be a regular file. A path a user or a dataset names can be anything: a
//! symbolic link to `/dev/zero` (a read that never ends), a FIFO (an open that blocks until a
//! writer comes), a socket, a device, a directory. Every file prep reads goes through here: it is
//! checked for what it is before it is read, opened so that the open cannot block, and metadata
//! files are read with a hard cap, never "until EOF".

use crate::util::error::{Error, IoContext, Result};
use std::fs::{File, FileType};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What a file type is, for a message: "a directory", "a FIFO (named pipe)", ...
pub fn describe(ft: &FileType) -> &'static str {
    if ft.is_file() {
        "a regular file"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// The error for `path` being `ft` where a regular file is expected.
pub fn not_a_file(path: &Path, ft: &FileType) -> Error {
    let what = describe(ft);
    Error::io(
        path,
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("is {what}, not a regular file"),
        ),
    )
}

/// Whether `path` is (or links to) something other than a regular file or a directory: a FIFO,
/// socket or device, which a tree walk must not open. `None` when it cannot be looked at.
pub fn special(path: &Path) -> Option<FileType> {
    let ft = std::fs::metadata(path).ok()?.file_type();
    (!ft.is_file() && !ft.is_dir()).then_some(ft)
}

/// Open `path` for reading; it must be a regular file or a symbolic link to one. The type is
/// checked before the open (a socket cannot be opened at all, and would say so unclearly) and
/// again on the open file (the path may change in between); the open itself is non-blocking, so
/// a FIFO put there in between cannot make it wait for a writer.
pub fn open(path: &Path) -> Result<File> {
    let ft = std::fs::metadata(path).at(path)?.file_type();
    if !ft.is_file() {
        return Err(not_a_file(path, &ft));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .at(path)?;
    let ft = f.metadata().at(path)?.file_type();
    if !ft.is_file() {
        return Err(not_a_file(path, &ft));
    }
    // O_NONBLOCK means nothing for a regular file's reads, but is cleared all the same so the
    // descriptor is an ordinary one for whatever reads it.
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function owns.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(f)
}

/// The whole of a regular file that is at most `cap` bytes, `what` naming it in the error
/// ("a manifest", "a checkpoint"). The read stops at `cap + 1` bytes whatever the size said: a
/// file that grows while it is read (or a special file the kernel calls empty) cannot make it run
/// on.
pub fn read_capped(path: &Path, cap: u64, what: &str) -> Result<Vec<u8>> {
    let f = open(path)?;
    let len = f.metadata().at(path)?.len();
    let too_large = |n: u64| {
        Error::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{n} bytes is larger than the {cap}-byte cap for {what}"),
            ),
        )
    };
    if len > cap {
        return Err(too_large(len));
    }
    let mut out = Vec::with_capacity(len as usize);
    f.take(cap + 1).read_to_end(&mut out).at(path)?;
    if out.len() as u64 > cap {
        return Err(too_large(out.len() as u64));
    }
    Ok(out)
}

/// [`read_capped`] as UTF-8 text.
pub fn read_text_capped(path: &Path, cap: u64, what: &str) -> Result<String> {
    let bytes = read_capped(path, cap, what)?;
    String::from_utf8(bytes).map_err(|_| {
        Error::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{what} is not UTF-8 text"),
            ),
        )
    })
}

/// Caps for the small files prep reads whole.
pub const JSON_CAP: u64 = 64 << 20;

/// A local folder as a `Store`: object names are paths under it.
#[derive(Debug, Clone)]
pub struct Dir {
    root: PathBuf,
}

impl Dir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Dir { root: root.into() }
    }
}

impl super::Store for Dir {
    fn location(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
    fn open(&self, name: &str) -> Result<Box<dyn super::Object>> {
        Ok(Box::new(LocalFile::open(&self.root.join(name))?))
    }
    fn read(&self, name: &str, cap: u64, what: &str) -> Result<Vec<u8>> {
        read_capped(&self.root.join(name), cap, what)
    }
    fn sizes(&self, names: &[&str]) -> Vec<Result<u64>> {
        names
            .iter()
            .map(|n| {
                let p = self.root.join(n);
                let m = std::fs::metadata(&p).at(&p)?;
                if !m.file_type().is_file() {
                    return Err(not_a_file(&p, &m.file_type()));
                }
                Ok(m.len())
            })
            .collect()
    }
}

/// A regular file (`open`'s checks) as an `Object`, read with positioned reads.
#[derive(Debug)]
pub struct LocalFile {
    path: PathBuf,
    file: File,
    len: u64,
}

impl LocalFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = open(path)?;
        let len = file.metadata().at(path)?.len();
        Ok(LocalFile {
            path: path.to_path_buf(),
            file,
            len,
        })
    }
}

impl super::Object for LocalFile {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        self.file.read_exact_at(buf, offset).at(&self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn special_files_are_refused_at_once() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let zero = d.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let sock = d.path().join("sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        for (p, word) in [
            (&fifo, "FIFO"),
            (&zero, "character device"),
            (&sock, "socket"),
            (&d.path().to_path_buf(), "directory"),
        ] {
            let t = Instant::now();
            let e = read_capped(p, 100, "a test file").unwrap_err().to_string();
            assert!(t.elapsed() < Duration::from_secs(2));
            assert!(e.contains(word) && e.contains(&*p.to_string_lossy()), "{e}");
        }
    }

    #[test]
    fn a_file_over_the_cap_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("big.json");
        std::fs::write(&p, vec![b' '; 101]).unwrap();
        let e = read_capped(&p, 100, "a manifest").unwrap_err().to_string();
        assert!(
            e.contains("101 bytes is larger than the 100-byte cap for a manifest"),
            "{e}"
        );
        assert_eq!(read_capped(&p, 101, "a manifest").unwrap().len(), 101);
    }

    #[test]
    fn a_folder_as_a_store_reads_its_objects_at_any_offset_and_names_them_in_errors() {
        use crate::store::Store;
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.bin"), b"0123456789").unwrap();
        let st = Dir::new(d.path());
        let o = st.open("a.bin").unwrap();
        assert_eq!(o.len(), 10);
        let mut b = [0u8; 4];
        o.read_exact_at(&mut b, 6).unwrap();
        assert_eq!(&b, b"6789");
        let e = o.read_exact_at(&mut b, 8).unwrap_err().to_string();
        assert!(e.contains("a.bin"), "{e}");
        assert_eq!(st.read("a.bin", 10, "a test file").unwrap(), b"0123456789");
        assert!(st.read("a.bin", 9, "a test file").is_err());
        let e = st.open("missing.bin").unwrap_err().to_string();
        assert!(e.contains("missing.bin"), "{e}");
        std::os::unix::fs::symlink("/dev/zero", d.path().join("z")).unwrap();
        let e = st.open("z").unwrap_err().to_string();
        assert!(e.contains("character device"), "{e}");
    }
}
