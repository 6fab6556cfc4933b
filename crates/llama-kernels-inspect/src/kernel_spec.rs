//! What the static report reads of one kernel: the region of its SASS and its reference launch.

/// How the report reads one kernel.
#[derive(Clone, Copy, Debug)]
pub enum Region {
    /// Code outside every loop (each thread handles a fixed amount).
    StraightLine,
    /// The body of the last loop (the kernel streams).
    LastLoop,
    /// The loop with the most HMMA.
    MatrixLoop,
}

/// A kernel the report describes, at a reference shape.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub module: &'static str,
    pub kernel: &'static str,
    /// The reference shape, in words.
    pub shape: &'static str,
    pub region: Region,
    /// Threads per block of the reference launch (its dynamic shared memory is the kernel's
    /// declaration: [`Spec::dyn_smem`]).
    pub threads: u32,
    /// Memory-bound kernels: elements per 128-bit vector, 128-bit stores per element, and the
    /// bytes each element moves (reads plus writes), of which reads.
    pub vec: usize,
    pub stores_per_elem: usize,
    pub bytes_per_elem: f64,
    pub read_bytes_per_elem: f64,
    /// Memory-bound kernels: elements of the reference launch (16k tokens), for the launch term.
    pub launch_elems: f64,
    /// Matrix kernels: the family's source, whose lines between `// perf-model: cold {` and
    /// `// perf-model: cold }` are paths the reference shape does not run (masked boundary tiles,
    /// paged K/V); the hot-path mix leaves out the instructions compiled from them.
    pub cold_source: Option<&'static str>,
}

impl Spec {
    /// The dynamic shared memory of the reference launch: the kernel's declaration.
    pub fn dyn_smem(&self) -> Result<u32, String> {
        super::declared_smem(self.kernel)
    }
}

/// The kernels the report covers (Llama 3 8B shapes, bf16).
pub const SPECS: &[Spec] = &[
    Spec {
        module: "rms_norm",
        kernel: "rms_norm_vec_bf16",
        shape: "hidden 4096, 16k rows (128 threads per row, 4 vectors each)",
        region: Region::StraightLine,
        threads: 128,
        vec: 8,
        stores_per_elem: 1,
        bytes_per_elem: 4.0,
        read_bytes_per_elem: 2.0,
        launch_elems: 16384.0 * 4096.0,
        cold_source: None,
    },
    Spec {
        module: "rms_norm",
        kernel: "fused_add_rms_norm_vec_bf16",
        shape: "hidden 4096, 16k rows",
        region: Region::StraightLine,
        threads: 128,
        vec: 8,
        stores_per_elem: 2,
        bytes_per_elem: 8.0,
        read_bytes_per_elem: 4.0,
        launch_elems: 16384.0 * 4096.0,
        cold_source: None,
    },
    Spec {
        module: "rope",
        kernel: "rope_half_split_vec_bf16",
        shape: "head_dim 128, 32 q + 8 kv heads (Llama 3, no qk-norm), 16k tokens",
        region: Region::LastLoop,
        threads: 320,
        vec: 8,
        stores_per_elem: 1,
        bytes_per_elem: 4.0,
        read_bytes_per_elem: 2.0,
        launch_elems: 16384.0 * 40.0 * 128.0,
        cold_source: None,
    },
    Spec {
        module: "rope",
        kernel: "rope_interleaved_vec_bf16",
        shape: "head_dim 128, 40 q + 8 kv heads (Llama 4, no qk-norm), 16k tokens",
        region: Region::LastLoop,
        threads: 256,
        vec: 8,
        stores_per_elem: 1,
        bytes_per_elem: 4.0,
        read_bytes_per_elem: 2.0,
        launch_elems: 16384.0 * 48.0 * 128.0,
        cold_source: None,
    },
    Spec {
        module: "rope",
        kernel: "rope_interleaved_norm_vec_bf16",
        shape: "head_dim 128, 40 q + 8 kv heads (Llama 4 RoPE layer, qk-norm), 16k tokens",
        region: Region::LastLoop,
        threads: 256,
        vec: 8,
        stores_per_elem: 1,
        bytes_per_elem: 4.0,
        read_bytes_per_elem: 2.0,
        launch_elems: 16384.0 * 48.0 * 128.0,
        cold_source: None,
    },
    Spec {
        module: "swiglu",
        kernel: "swiglu_vec_bf16",
        shape: "ffn 14336, packed gate|up, 16k tokens",
        region: Region::LastLoop,
        threads: 256,
        vec: 8,
        stores_per_elem: 1,
        bytes_per_elem: 6.0,
        read_bytes_per_elem: 4.0,
        launch_elems: 16384.0 * 14336.0,
        cold_source: None,
    },
    Spec {
        module: "attention",
        kernel: "attention_hd128_bf16",
        shape: "causal prefill, head_dim 128",
        region: Region::MatrixLoop,
        threads: 128,
        vec: 0,
        stores_per_elem: 0,
        bytes_per_elem: 0.0,
        read_bytes_per_elem: 0.0,
        launch_elems: 0.0,
        cold_source: Some(include_str!("../../llama-kernels/kernels/attention.cu")),
    },
];
