//! Reading files that come from outside (a pack, a spec's folder, a model
//! folder, a remote's config): regular files only, of bounded size, checked
//! on the file opened. What is checked is the descriptor (`fstat` after the
//! open), never the path before it, so a file swapped for a link, a FIFO or a
//! larger file between a check and a read is never read: there is no gap. A
//! FIFO is refused at once, not waited on for a writer.
//!
//! A foundation: the encodings above it read their artifacts through it.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A file from outside (a pack's, a spec's) that is not a regular file of at
/// most a given size: each names the file.
#[derive(Debug, thiserror::Error)]
pub enum BoundedFileError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a regular file", .path.display())]
    NotAFile { path: PathBuf },
    #[error("{}: {bytes} bytes, over the limit of {max}", .path.display())]
    TooLarge { path: PathBuf, bytes: u64, max: u64 },
}

impl BoundedFileError {
    /// Nothing there at all (for a reader to which an absent file means a default).
    pub fn is_absent(&self) -> bool {
        matches!(self, BoundedFileError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Opens `path` if it is a regular file and not a link ([`open_regular`]
/// with `O_NOFOLLOW`): a link, a FIFO, a device or a folder is `NotAFile`.
pub fn open_no_link(path: &Path) -> Result<File, BoundedFileError> {
    open_regular(path, libc::O_NOFOLLOW).map_err(|source| match source.raw_os_error() {
        // O_NOFOLLOW on a link fails with ELOOP.
        Some(libc::ELOOP) => BoundedFileError::NotAFile { path: path.to_path_buf() },
        _ if source.kind() == std::io::ErrorKind::InvalidInput => {
            BoundedFileError::NotAFile { path: path.to_path_buf() }
        }
        _ => BoundedFileError::Io { path: path.to_path_buf(), source },
    })
}

/// Reads `path` whole if it is a regular file (a link is never followed) of
/// at most `max` bytes. What is checked is the file opened (`O_NOFOLLOW`, then
/// `fstat` on the descriptor), and the read stops past `max`, so a file
/// swapped for a link, a FIFO or a larger file between a check and the read
/// is never read: there is no such gap. A FIFO is refused without waiting.
pub fn read_bounded_file(path: &Path, max: u64) -> Result<Vec<u8>, BoundedFileError> {
    read_opened(open_no_link(path)?, max).map_err(|e| match e {
        OpenedReadError::TooLarge(bytes) => BoundedFileError::TooLarge { path: path.to_path_buf(), bytes, max },
        OpenedReadError::Io(source) => BoundedFileError::Io { path: path.to_path_buf(), source },
    })
}

/// [`read_bounded_file`] as UTF-8 text.
pub fn read_bounded_text(path: &Path, max: u64) -> Result<String, BoundedFileError> {
    String::from_utf8(read_bounded_file(path, max)?).map_err(|e| BoundedFileError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not UTF-8 text: {}", e.utf8_error())),
    })
}

/// Why an opened file was not read whole.
#[derive(Debug)]
pub enum OpenedReadError {
    /// Over the bound: its size before reading, or what the read found.
    TooLarge(u64),
    Io(std::io::Error),
}

/// An opened file whole (one opened by [`open_regular`], or by a caller's
/// own checks such as `fsx::open_user_file`), refused past `max` bytes: by
/// its size before reading, and by what the read found (a file that grew
/// meanwhile is never taken whole at `max + 1` bytes).
pub fn read_opened(file: File, max: u64) -> Result<Vec<u8>, OpenedReadError> {
    use std::io::Read;
    let len = file.metadata().map_err(OpenedReadError::Io)?.len();
    if len > max {
        return Err(OpenedReadError::TooLarge(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max + 1).read_to_end(&mut bytes).map_err(OpenedReadError::Io)?;
    if bytes.len() as u64 > max {
        return Err(OpenedReadError::TooLarge(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Opens `path` for reading if it is a regular file. Anything else (a
/// FIFO, a device, a folder) is refused (`InvalidInput`, "not a regular
/// file") without waiting: `O_NONBLOCK` makes the open of a FIFO return at
/// once instead of blocking until a writer comes, and is cleared again
/// before the file is handed back. `flags` adds open flags (`O_NOFOLLOW`).
pub fn open_regular(path: &Path, flags: libc::c_int) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    let file = OpenOptions::new().read(true).custom_flags(flags | libc::O_NONBLOCK).open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    // SAFETY: fcntl on a descriptor this function owns, with integer arguments.
    let fd = file.as_raw_fd();
    let got = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if got < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, got & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(file)
}

/// Reads `path` whole if it is a regular file (through links: a Hugging Face
/// cache folder's files are links into its blobs) of at most `max` bytes. A
/// FIFO or a device is refused at once (see [`open_regular`]), never waited on
/// or read without end, and a larger file is refused before it is read.
pub fn read_regular(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    read_opened(open_regular(path, 0)?, max).map_err(|e| match e {
        OpenedReadError::TooLarge(bytes) => {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{bytes} bytes, over the {max} allowed here"))
        }
        OpenedReadError::Io(e) => e,
    })
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_text(path: &Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_regular(path, max)?).map_err(|e| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not UTF-8 text: {}", e.utf8_error()))
    })
}

/// Makes a FIFO at `path`, for tests of readers that must refuse one.
#[cfg(test)]
pub(crate) fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path the test owns.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn a_bounded_file_is_a_regular_file_within_its_size_and_a_link_to_one_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("MANIFEST.json");
        fs::write(&file, "12345").unwrap();
        assert_eq!(read_bounded_file(&file, 5).unwrap(), b"12345");
        assert_eq!(read_bounded_text(&file, 5).unwrap(), "12345");
        let e = read_bounded_file(&file, 4).unwrap_err().to_string();
        assert!(e.ends_with("MANIFEST.json: 5 bytes, over the limit of 4"), "{e}");
        let link = t.path().join("linked.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(read_bounded_file(&link, 5).unwrap_err().to_string().ends_with("linked.json: not a regular file"));
        assert!(matches!(read_bounded_file(&t.path().join("none"), 5), Err(BoundedFileError::Io { .. })));
        assert!(matches!(read_bounded_file(t.path(), 5), Err(BoundedFileError::NotAFile { .. })));
        fs::write(&file, b"\xff\xfe").unwrap();
        assert!(read_bounded_text(&file, 5).unwrap_err().to_string().contains("not UTF-8 text"));
    }

    #[test]
    fn a_fifo_is_refused_at_once_not_waited_on_for_a_writer() {
        let t = tempfile::tempdir().unwrap();
        let fifo = t.path().join("SHA256SUMS");
        mkfifo(&fifo);
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || tx.send(read_bounded_file(&path, 5).map_err(|e| e.to_string())));
        let got = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the read waited on the FIFO");
        assert!(got.unwrap_err().ends_with("SHA256SUMS: not a regular file"));
    }
}
