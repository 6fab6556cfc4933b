//! The device code built by `build.rs`: one [`ModuleSource`] per kernel family (PTX and cubins
//! for sm_90 and sm_80, ptxas reports, the emulated registry).
//!
//! Normally the device code is embedded in the crate. A build with
//! `LLK_DEVICE_CODE_LOCATION=external` embeds only each file's path, size and SHA-256; the files
//! are read, on first use, from the folder named by the `LLK_DEVICE_CODE_DIR` environment
//! variable ([`DEVICE_CODE_DIR_VAR`]), in the layout of `kernels/prebuilt/`
//! (`sm_90/<family>.ptx`, `.cubin`, `.ptxas.txt`, and the same under `sm_80/`). Every file is
//! checked against its embedded hash before anything uses it; a folder that is not set, a
//! missing file or a different one is a [`DeviceCodeError`], never a panic; a file's type and
//! size are checked before it is read. The emulated target's kernels are host code, linked in
//! every build: it reads only the `ptxas` reports, for each kernel's static shared memory, and
//! when they cannot be read (the folder unset, a file missing or different) it checks the
//! dynamic shared memory of each launch alone.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use sha2::{Digest, Sha256};

use crate::error::{DeviceCodeError, Error, Result};
use crate::ffi::emu_abi;

/// The environment variable that names the folder a build with external device code
/// (`LLK_DEVICE_CODE_LOCATION=external`) reads its device code from, at run time.
pub const DEVICE_CODE_DIR_VAR: &str = "LLK_DEVICE_CODE_DIR";

/// One kernel family as built by `build.rs`: its device code and the host registry of its
/// emulated kernels.
pub(crate) struct ModuleSource {
    pub name: &'static str,
    pub code: DeviceCode,
    pub emu_table: unsafe extern "C" fn(count: *mut u64) -> *const emu_abi::LlkEmuKernel,
}

/// Where a family's device code is: in the crate, or in files checked against embedded hashes.
/// A build constructs one of the two variants only.
#[allow(dead_code)]
pub(crate) enum DeviceCode {
    /// The bytes, embedded in the crate.
    Embedded(DeviceFiles),
    /// The files, in [`DeviceFiles::FIELDS`] order, under [`DEVICE_CODE_DIR_VAR`].
    External([ExternalFile; 6]),
}

/// The six device-code files of one family.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceFiles {
    pub ptx_sm90: &'static str,
    pub ptx_sm80: &'static str,
    pub cubin_sm90: &'static [u8],
    pub cubin_sm80: &'static [u8],
    pub ptxas_sm90: &'static str,
    pub ptxas_sm80: &'static str,
}

impl DeviceFiles {
    /// The order of [`DeviceCode::External`]'s files: `(arch, extension)`.
    #[allow(dead_code)]
    pub const FIELDS: [(&'static str, &'static str); 6] = DEVICE_FILE_ORDER;
}

/// What one external device-code file must be.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ExternalFile {
    /// Relative to [`DEVICE_CODE_DIR_VAR`], with `/` separators: `sm_90/attention.ptx`.
    pub path: &'static str,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its SHA-256, lowercase hex.
    pub sha256: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

/// How `build.rs` obtained the device code of this build: `"source"` (compiled by nvcc here)
/// or `"prebuilt"` (the committed `kernels/prebuilt/` files, whose manifest matched the
/// sources), followed by details; a build with external device code says so at the end.
pub const DEVICE_CODE_ORIGIN: &str = env!("LLK_DEVICE_CODE_ORIGIN");

/// Whether this build reads its device code at run time from [`DEVICE_CODE_DIR_VAR`] (built
/// with `LLK_DEVICE_CODE_LOCATION=external`) instead of carrying it.
pub const DEVICE_CODE_EXTERNAL: bool = EXTERNAL;

impl ModuleSource {
    /// This family's device code: embedded, or the checked external files.
    pub(crate) fn files(&self) -> Result<DeviceFiles> {
        match &self.code {
            DeviceCode::Embedded(files) => Ok(*files),
            DeviceCode::External(_) => external_files()?
                .iter()
                .find(|(name, _)| *name == self.name)
                .map(|(_, owned)| owned.borrow())
                .ok_or(Error::KernelNotFound { module: self.name, symbol: "<module>" }),
        }
    }
}

/// One family's external files, as read.
#[derive(Debug)]
struct OwnedFiles {
    ptx_sm90: String,
    ptx_sm80: String,
    cubin_sm90: Vec<u8>,
    cubin_sm80: Vec<u8>,
    ptxas_sm90: String,
    ptxas_sm80: String,
}

impl OwnedFiles {
    fn borrow(&'static self) -> DeviceFiles {
        DeviceFiles {
            ptx_sm90: &self.ptx_sm90,
            ptx_sm80: &self.ptx_sm80,
            cubin_sm90: &self.cubin_sm90,
            cubin_sm80: &self.cubin_sm80,
            ptxas_sm90: &self.ptxas_sm90,
            ptxas_sm80: &self.ptxas_sm80,
        }
    }
}

/// The external files of every family, read and checked on first use and kept for the life of
/// the program. A failure is not kept: a later call, with the folder fixed, tries again.
fn external_files() -> Result<&'static [(&'static str, OwnedFiles)], DeviceCodeError> {
    static LOADED: OnceLock<Vec<(&'static str, OwnedFiles)>> = OnceLock::new();
    static LOADING: Mutex<()> = Mutex::new(());
    if let Some(files) = LOADED.get() {
        return Ok(files);
    }
    let _one_at_a_time = LOADING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(files) = LOADED.get() {
        return Ok(files);
    }
    let dir = device_code_dir(std::env::var_os(DEVICE_CODE_DIR_VAR))?;
    let mut all = Vec::with_capacity(MODULES.len());
    for m in MODULES {
        if let DeviceCode::External(expected) = &m.code {
            all.push((m.name, load_family(&dir, expected)?));
        }
    }
    Ok(LOADED.get_or_init(|| all))
}

/// The folder that [`DEVICE_CODE_DIR_VAR`] names: unset and empty are the same error.
fn device_code_dir(value: Option<std::ffi::OsString>) -> Result<PathBuf, DeviceCodeError> {
    value.filter(|d| !d.is_empty()).map(PathBuf::from).ok_or(DeviceCodeError::DirUnset)
}

/// Reads and checks one family's six files.
fn load_family(dir: &Path, expected: &[ExternalFile; 6]) -> Result<OwnedFiles, DeviceCodeError> {
    let [ptx_sm90, ptx_sm80, cubin_sm90, cubin_sm80, ptxas_sm90, ptxas_sm80] = expected;
    let text = |file: &ExternalFile| -> Result<String, DeviceCodeError> {
        String::from_utf8(load_checked(dir, file)?).map_err(|_| DeviceCodeError::NotText { path: dir.join(file.path) })
    };
    Ok(OwnedFiles {
        ptx_sm90: text(ptx_sm90)?,
        ptx_sm80: text(ptx_sm80)?,
        cubin_sm90: load_checked(dir, cubin_sm90)?,
        cubin_sm80: load_checked(dir, cubin_sm80)?,
        ptxas_sm90: text(ptxas_sm90)?,
        ptxas_sm80: text(ptxas_sm80)?,
    })
}

/// One file under `dir`, if it has the expected size and SHA-256. The file's type and size are
/// checked before it is read, and at most one byte more than expected is read: a FIFO (which
/// would block), a device such as `/dev/zero` (which would never end) or a file of the wrong
/// size is an error without reading it.
pub(crate) fn load_checked(dir: &Path, file: &ExternalFile) -> Result<Vec<u8>, DeviceCodeError> {
    use std::io::Read;
    let path = dir.join(file.path);
    let unreadable = |reason: String| DeviceCodeError::Unreadable { path: path.clone(), reason };
    let mismatch = |found_bytes: u64, found_sha256: String| DeviceCodeError::Mismatch {
        path: path.clone(),
        expected_bytes: file.bytes,
        found_bytes,
        expected_sha256: file.sha256,
        found_sha256,
    };
    let meta = std::fs::metadata(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            DeviceCodeError::Missing { path: path.clone(), bytes: file.bytes, sha256: file.sha256 }
        }
        _ => unreadable(e.to_string()),
    })?;
    if !meta.is_file() {
        return Err(unreadable(format!("not a regular file ({:?})", meta.file_type())));
    }
    if meta.len() != file.bytes {
        return Err(mismatch(meta.len(), "(not read: the size differs)".into()));
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    // Opening never blocks, even if the path became a FIFO since the check above.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let opened = options.open(&path).map_err(|e| unreadable(e.to_string()))?;
    if !opened.metadata().map_err(|e| unreadable(e.to_string()))?.is_file() {
        return Err(unreadable("not a regular file".into()));
    }
    let mut bytes = Vec::with_capacity(file.bytes as usize);
    opened.take(file.bytes.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| unreadable(e.to_string()))?;
    let found: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    if bytes.len() as u64 != file.bytes || found != file.sha256 {
        return Err(mismatch(bytes.len() as u64, found));
    }
    Ok(bytes)
}

/// Build artifacts of one kernel family, for inspection (`llama-kernels info`, static checks).
#[derive(Clone, Copy, Debug)]
#[doc(hidden)]
pub struct KernelModuleInfo {
    /// The family name, which is also the `.cu` file stem.
    pub name: &'static str,
    /// PTX for sm_90, as built.
    pub ptx_sm90: &'static str,
    /// PTX for sm_80, as built.
    pub ptx_sm80: &'static str,
    /// The sm_90 cubin, as built.
    pub cubin_sm90: &'static [u8],
    /// The sm_80 cubin, as built.
    pub cubin_sm80: &'static [u8],
    /// `ptxas -v` output for the sm_90 PTX (registers, spills, shared memory per kernel).
    pub ptxas_sm90: &'static str,
    /// `ptxas -v` output for the sm_80 PTX.
    pub ptxas_sm80: &'static str,
}

/// Every kernel family compiled into this crate, with its device code. Fails only in a build with
/// external device code ([`DEVICE_CODE_EXTERNAL`]) whose files cannot be used
/// ([`DeviceCodeError`]).
#[doc(hidden)]
pub fn kernel_modules() -> Result<impl Iterator<Item = KernelModuleInfo>> {
    let mut v = Vec::with_capacity(MODULES.len());
    for m in MODULES {
        let f = m.files()?;
        v.push(KernelModuleInfo {
            name: m.name,
            ptx_sm90: f.ptx_sm90,
            ptx_sm80: f.ptx_sm80,
            cubin_sm90: f.cubin_sm90,
            cubin_sm80: f.cubin_sm80,
            ptxas_sm90: f.ptxas_sm90,
            ptxas_sm80: f.ptxas_sm80,
        });
    }
    Ok(v.into_iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("llk-modules-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sm_90")).unwrap();
        dir
    }

    const HELLO_SHA: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

    fn hello() -> ExternalFile {
        ExternalFile { path: "sm_90/x.ptx", bytes: 5, sha256: HELLO_SHA }
    }

    #[test]
    fn an_unset_or_empty_folder_is_a_named_error() {
        assert_eq!(device_code_dir(None), Err(DeviceCodeError::DirUnset));
        assert_eq!(device_code_dir(Some("".into())), Err(DeviceCodeError::DirUnset));
        assert_eq!(device_code_dir(Some("/opt/llk".into())), Ok(PathBuf::from("/opt/llk")));
        let message = crate::Error::from(DeviceCodeError::DirUnset).to_string();
        assert!(
            message.starts_with("device code unavailable: ") && message.contains("LLK_DEVICE_CODE_DIR"),
            "{message}"
        );
    }

    #[test]
    fn an_external_file_is_loaded_only_when_its_hash_matches() {
        let dir = scratch("hash");
        assert!(matches!(load_checked(&dir, &hello()), Err(DeviceCodeError::Missing { bytes: 5, .. })));
        std::fs::write(dir.join("sm_90/x.ptx"), b"hello").unwrap();
        assert_eq!(load_checked(&dir, &hello()).unwrap(), b"hello");
        std::fs::write(dir.join("sm_90/x.ptx"), b"hellO").unwrap();
        let e = load_checked(&dir, &hello()).unwrap_err();
        assert!(matches!(&e, DeviceCodeError::Mismatch { found_bytes: 5, expected_sha256: HELLO_SHA, .. }), "{e}");
        assert!(e.to_string().contains("not the file this build was made with"), "{e}");
        std::fs::write(dir.join("sm_90/x.ptx"), b"hello!").unwrap();
        assert!(matches!(load_checked(&dir, &hello()), Err(DeviceCodeError::Mismatch { found_bytes: 6, .. })));
        std::fs::remove_file(dir.join("sm_90/x.ptx")).unwrap();
        std::fs::create_dir(dir.join("sm_90/x.ptx")).unwrap();
        assert!(matches!(load_checked(&dir, &hello()), Err(DeviceCodeError::Unreadable { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[cfg(unix)]
    #[test]
    fn fifos_devices_and_oversized_files_are_refused_without_reading_them() {
        let dir = scratch("special");
        let file = dir.join("sm_90/x.ptx");
        // A FIFO with no writer: reading it would block forever.
        let fifo = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `fifo` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let e = load_checked(&dir, &hello()).unwrap_err();
        assert!(
            matches!(&e, DeviceCodeError::Unreadable { reason, .. } if reason.contains("not a regular file")),
            "{e}"
        );
        std::fs::remove_file(&file).unwrap();
        // A link to /dev/zero: reading it would never end.
        std::os::unix::fs::symlink("/dev/zero", &file).unwrap();
        let e = load_checked(&dir, &hello()).unwrap_err();
        assert!(
            matches!(&e, DeviceCodeError::Unreadable { reason, .. } if reason.contains("not a regular file")),
            "{e}"
        );
        std::fs::remove_file(&file).unwrap();
        // A 2 GiB (sparse) file is refused by its size, before anything is read.
        std::fs::File::create(&file).unwrap().set_len(2 << 30).unwrap();
        let e = load_checked(&dir, &hello()).unwrap_err();
        assert!(
            matches!(&e, DeviceCodeError::Mismatch { found_bytes, found_sha256, .. }
            if *found_bytes == 2 << 30 && found_sha256.contains("not read")),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_family_needs_all_six_files_and_text_where_text_is_expected() {
        let dir = scratch("family");
        let names = DeviceFiles::FIELDS.map(|(arch, ext)| format!("{arch}/f.{ext}"));
        std::fs::create_dir_all(dir.join("sm_80")).unwrap();
        let contents: [&[u8]; 6] = [b".version 9.0", b".version 9.0 80", b"\x7fELF9", b"\x7fELF8", b"r90", b"\xff80"];
        let sha = |b: &[u8]| -> &'static str {
            String::leak(Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect::<String>())
        };
        let expected: [ExternalFile; 6] = std::array::from_fn(|i| ExternalFile {
            path: String::leak(names[i].clone()),
            bytes: contents[i].len() as u64,
            sha256: sha(contents[i]),
        });
        for i in 0..5 {
            std::fs::write(dir.join(&names[i]), contents[i]).unwrap();
        }
        let missing = load_family(&dir, &expected).unwrap_err();
        assert!(matches!(&missing, DeviceCodeError::Missing { path, .. } if path.ends_with("sm_80/f.ptxas.txt")));
        std::fs::write(dir.join(&names[5]), contents[5]).unwrap();
        assert!(matches!(load_family(&dir, &expected), Err(DeviceCodeError::NotText { .. })));
        let mut fixed = expected;
        fixed[5] = ExternalFile { bytes: 3, sha256: sha(b"r80"), ..expected[5] };
        std::fs::write(dir.join(&names[5]), b"r80").unwrap();
        let files = load_family(&dir, &fixed).unwrap();
        assert_eq!(
            (files.ptx_sm80.as_str(), files.cubin_sm90.as_slice(), files.ptxas_sm80.as_str()),
            (".version 9.0 80", &b"\x7fELF9"[..], "r80")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
