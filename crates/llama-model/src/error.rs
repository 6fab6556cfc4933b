//! The model crate's error type: the kernels' named errors, and those of files, configs,
//! tokenizers and templates, each carrying what explains it.

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A kernel, tensor or device error ([`llama_kernels::Error`]): validation, the driver, the
    /// emulator, the reference.
    #[error(transparent)]
    Kernel(#[from] llama_kernels::Error),

    /// A Hugging Face `config.json` field (or the GGUF metadata key standing for it) is missing,
    /// malformed or has an unsupported value.
    #[error("config field `{field}`: {why}")]
    Config {
        /// The field's key, dotted when nested (`text_config.head_dim`); `<config.json>`: the whole file.
        field: String,
        /// What is wrong with it.
        why: String,
    },

    /// A checkpoint tensor is missing, has a shape that disagrees with the config, or a dtype
    /// that cannot be converted to the run dtype.
    #[error("checkpoint tensor `{tensor}`: {why}")]
    Checkpoint {
        /// The tensor's name (full, or relative to its layer's prefix).
        tensor: String,
        /// What is wrong with it.
        why: String,
    },

    /// A file could not be read (a checkpoint's config, index or safetensors file, a GGUF file,
    /// a tokenizer), or its contents are malformed.
    #[error("{path}: {why}")]
    Io {
        /// The file or directory.
        path: String,
        /// The system's error, or what is wrong with the contents.
        why: String,
    },

    /// Something this crate does not read or run, named (`GGUF tensor type Q2_K`): returned
    /// before anything is loaded, never a silent change of the model.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What is not supported, named.
        what: String,
    },
}

impl Error {
    /// [`llama_kernels::Error::InvalidArgument`]: `name` of `op` is `value`, wrong because of `why`.
    pub fn invalid(
        op: &'static str,
        name: &'static str,
        value: impl std::fmt::Display,
        why: impl Into<String>,
    ) -> Self {
        Error::Kernel(llama_kernels::Error::invalid(op, name, value, why))
    }

    /// [`llama_kernels::Error::ShapeMismatch`]: `what` of `op` has shape `got`; `expected` says
    /// what fits.
    pub fn shape(op: &'static str, what: &'static str, got: Vec<usize>, expected: impl Into<String>) -> Self {
        Error::Kernel(llama_kernels::Error::shape(op, what, got, expected))
    }

    /// The kernel error inside, if this is one.
    pub fn kernel(&self) -> Option<&llama_kernels::Error> {
        match self {
            Error::Kernel(e) => Some(e),
            _ => None,
        }
    }
}
