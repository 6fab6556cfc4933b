//! Opening files a checkpoint names: regular files only.

use std::path::Path;

use crate::error::{Error, Result};

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
