//! Opening and reading the files a checkpoint names: regular files only, read with bounds.
//!
//! * [`open_regular`]: a FIFO, a device or a directory under a file's name is refused before it
//!   is read (reading a FIFO blocks, reading `/dev/zero` never ends).
//! * [`read_bounded`]: a JSON or template file read whole, at most a documented size (one byte
//!   more is read to tell a file at the limit from a longer one).
//! * [`ModelFile`]: a weights file (GGUF, safetensors) read by positioned reads into memory the
//!   reader owns. Weight files are not memory-mapped: a mapping of a file that another process
//!   truncates raises `SIGBUS` on the next access to a vanished page, which no bounds check can
//!   prevent. A positioned read of a truncated file instead ends early, which is a named
//!   [`Error::Io`]. Every tensor is converted or repacked once at load, so a copy costs no more
//!   memory than the mapping's page cache did.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Mutex;

use crate::error::{Error, Result};

/// Largest JSON configuration file read (`config.json`, `model.safetensors.index.json`,
/// `tokenizer_config.json`, `generation_config.json`), in bytes.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Opens `path` for reading if it is a regular file (after following symlinks): a FIFO, a device
/// or a directory under a checkpoint file's name is an error, never opened (opening a FIFO would
/// block, reading a device would not end).
pub fn open_regular(path: &Path) -> Result<std::fs::File> {
    let io = |why: String| Error::Io { path: path.display().to_string(), why };
    let meta = std::fs::metadata(path).map_err(|e| io(e.to_string()))?;
    if !meta.is_file() {
        return Err(io(format!("not a regular file ({:?})", meta.file_type())));
    }
    let file = std::fs::File::open(path).map_err(|e| io(e.to_string()))?;
    // The same check on what was opened, in case the path changed in between.
    if !file.metadata().map_err(|e| io(e.to_string()))?.is_file() {
        return Err(io("not a regular file".into()));
    }
    Ok(file)
}

/// Reads the regular file `path` whole if it holds at most `max` bytes, failing by name when it
/// is longer; at most `max + 1` bytes are read, whatever the file's size.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>> {
    let io = |why: String| Error::Io { path: path.display().to_string(), why };
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| io(e.to_string()))?;
    if bytes.len() as u64 > max {
        return Err(io(format!("larger than the {max} bytes accepted")));
    }
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_bounded_text(path: &Path, max: u64) -> Result<String> {
    String::from_utf8(read_bounded(path, max)?)
        .map_err(|_| Error::Io { path: path.display().to_string(), why: "not UTF-8 text".into() })
}

/// A weights file read by positioned reads (see the module docs): its length is taken once, at
/// open, and every read is checked against it and against what the file still holds.
pub struct ModelFile {
    path: String,
    file: Mutex<std::fs::File>,
    len: u64,
}

impl std::fmt::Debug for ModelFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ModelFile({}, {} bytes)", self.path, self.len)
    }
}

impl ModelFile {
    /// Opens the regular file `path`.
    pub fn open(path: &Path) -> Result<ModelFile> {
        let file = open_regular(path)?;
        let name = path.display().to_string();
        let len = file.metadata().map_err(|e| Error::Io { path: name.clone(), why: e.to_string() })?.len();
        Ok(ModelFile { path: name, file: Mutex::new(file), len })
    }

    /// The file's path, as given.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The file's length when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file was empty when it was opened.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes `start..end` of the file. A range past the length seen at open is an error before
    /// anything is allocated; a file that has since shrunk below `end` is an [`Error::Io`]
    /// saying so.
    pub fn read(&self, start: u64, end: u64) -> Result<Vec<u8>> {
        let io = |why: String| Error::Io { path: self.path.clone(), why };
        if start > end || end > self.len {
            return Err(io(format!("byte range {start}..{end} lies outside the file's {} bytes", self.len)));
        }
        let n = usize::try_from(end - start).map_err(|_| io(format!("byte range {start}..{end} is too large")))?;
        let mut bytes = vec![0u8; n];
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.seek(SeekFrom::Start(start)).map_err(|e| io(e.to_string()))?;
        file.read_exact(&mut bytes).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                io(format!("the file ended before byte {end}: it was truncated after it was opened"))
            }
            _ => io(e.to_string()),
        })?;
        Ok(bytes)
    }
}
