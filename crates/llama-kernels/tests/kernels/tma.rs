//! The emulator's tensor copies (kernels/emu/emu_tma.h) through `selftest_tma`: one
//! `cp.async.bulk.tensor` of a random box (rank 1 to 5, partly or wholly outside the tensor,
//! every swizzle, 1 to 8-byte elements) from a tensor map, completing on an mbarrier. Shared
//! memory after the copy must equal the box as the PTX ISA lays it out, computed here element
//! by element, bit for bit under every schedule and both completion timings; each planted
//! misuse must be reported by name, and each layout the driver's encoder refuses must be refused
//! with a named error on every target.

use crate::common;

use llama_kernels::dev::selftest::{self, TMA_HEADER, TMA_OUT_WORDS};
use llama_kernels::dev::testing::Rng;
use llama_kernels::{CpAsyncTiming, DType, Device, Error, Target, Tensor, TmaLayout, TmaOobFill, TmaSwizzle};
use selftest::{Kernel, Variant};

/// Every schedule under both completion timings.
fn devices() -> Vec<Device> {
    common::every_schedule(&[CpAsyncTiming::AtWait, CpAsyncTiming::AtIssue])
}

/// One copy: the source tensor's bytes and dtype, the map, the coordinates and where it lands.
#[derive(Clone, Debug)]
struct Case {
    dtype: DType,
    source: Vec<u8>,
    layout: TmaLayout,
    coords: Vec<i32>,
    offset: usize,
}

/// A source tensor holding `bytes` as elements of `dtype`.
fn source_tensor(device: &Device, dtype: DType, bytes: &[u8]) -> Tensor {
    let t = match dtype {
        DType::U8 => Tensor::from_slice(device, bytes, &[bytes.len()]),
        DType::BF16 => {
            let v: Vec<half::bf16> =
                bytes.chunks(2).map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]]))).collect();
            Tensor::from_slice(device, &v, &[v.len()])
        }
        DType::F32 => {
            let v: Vec<f32> =
                bytes.chunks(4).map(|c| f32::from_bits(u32::from_le_bytes(c.try_into().unwrap()))).collect();
            Tensor::from_slice(device, &v, &[v.len()])
        }
        DType::I64 => {
            let v: Vec<i64> = bytes.chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
            Tensor::from_slice(device, &v, &[v.len()])
        }
        d => panic!("no source of {d}"),
    };
    t.unwrap()
}

/// The swizzle of the PTX ISA's shared-memory layouts: 16-byte chunk bits [0, b) XOR address
/// bits [7, 7 + b), b = log2(span / 16).
fn swizzle(addr: usize, span: usize) -> usize {
    if span == 0 { addr } else { addr ^ (((addr >> 7) % (span / 16)) << 4) }
}

impl Case {
    fn esize(&self) -> usize {
        self.dtype.size()
    }
    fn box_bytes(&self) -> usize {
        self.layout.box_bytes(self.dtype) as usize
    }

    /// Shared memory [offset, offset + box bytes) after the copy, element by element.
    fn expected(&self) -> Vec<u8> {
        let (l, e) = (&self.layout, self.esize());
        let mut out = vec![0u8; self.box_bytes()];
        let fill = if l.oob == TmaOobFill::Nan { 0xff } else { 0 };
        let count: usize = l.box_dims.iter().map(|&b| b as usize).product();
        for n in 0..count {
            // Box index (i_0, ..., i_{r-1}), dimension 0 fastest; the tensor's element there.
            let (mut rest, mut src, mut inside) = (n, 0i64, true);
            for d in 0..l.dims.len() {
                let i = rest % l.box_dims[d] as usize;
                rest /= l.box_dims[d] as usize;
                let x = i64::from(self.coords[d]) + i as i64;
                inside &= x >= 0 && x < l.dims[d] as i64;
                src += x * if d == 0 { e as i64 } else { (l.strides[d - 1] as usize * e) as i64 };
            }
            let at = swizzle(self.offset + n * e, l.swizzle.bytes() as usize) - self.offset;
            for b in 0..e {
                out[at + b] = if inside { self.source[src as usize + b] } else { fill };
            }
        }
        out
    }

    /// The header words of the kernel's input.
    fn header(&self, bug: u32) -> Vec<f32> {
        let mut w = vec![0u32; TMA_HEADER];
        w[0] = self.layout.dims.len() as u32;
        for (d, &c) in self.coords.iter().enumerate() {
            w[1 + d] = c as u32;
        }
        w[6] = self.offset as u32;
        w[7] = self.box_bytes() as u32;
        w[8] = bug;
        w.into_iter().map(f32::from_bits).collect()
    }

    /// Runs the copy; returns shared memory as bytes.
    fn run(&self, device: &Device, variant: Variant, bug: u32) -> Result<Vec<u8>, Error> {
        let source = source_tensor(device, self.dtype, &self.source);
        let header = self.header(bug);
        let input = Tensor::from_slice(device, &header, &[header.len()])?;
        let out = Tensor::poisoned(device, DType::F32, &[TMA_OUT_WORDS])?;
        selftest::launch_tma(variant, &source, &self.layout, &input, &out)?;
        Ok(out.to_vec::<f32>()?.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect())
    }
}

/// A random case: rank, dtype, dims, padded strides, a box (its rows the swizzle span when
/// swizzled), coordinates from well inside to partly and wholly outside the tensor.
fn random_case(rng: &mut Rng) -> Case {
    let pick = |rng: &mut Rng, n: usize| rng.below(n as u64) as usize;
    let dtype = [DType::U8, DType::BF16, DType::F32, DType::I64][pick(rng, 4)];
    let e = dtype.size();
    let rank = 1 + pick(rng, 5);
    let swizzle = if rank == 1 {
        TmaSwizzle::None
    } else {
        [TmaSwizzle::None, TmaSwizzle::B32, TmaSwizzle::B64, TmaSwizzle::B128][pick(rng, 4)]
    };
    let span = swizzle.bytes() as usize;
    let oob = if dtype.is_float() && pick(rng, 2) == 1 { TmaOobFill::Nan } else { TmaOobFill::Zeros };
    // The box: row bytes a multiple of 16 (exactly the span when swizzled), at most ~12 KiB.
    let mut box_dims = vec![if span > 0 { (span / e) as u32 } else { (16 * (1 + pick(rng, 8)) / e) as u32 }];
    let mut bytes = box_dims[0] as usize * e;
    for _ in 1..rank {
        let b = 1 + pick(rng, (12288 / bytes).clamp(1, 9));
        box_dims.push(b as u32);
        bytes *= b;
    }
    // Dims a little larger or smaller than the box; strides padded past the row below.
    let dims: Vec<u64> =
        box_dims.iter().map(|&b| (b as usize + pick(rng, 5)).saturating_sub(2).max(1) as u64).collect();
    let mut strides = Vec::new();
    let mut extent = dims[0] as usize * e;
    for d in 1..rank {
        let stride_bytes = extent.div_ceil(16) * 16 + 16 * pick(rng, 3);
        strides.push((stride_bytes / e) as u64);
        extent = stride_bytes * dims[d] as usize;
    }
    let coords: Vec<i32> = (0..rank)
        .map(|d| match pick(rng, 6) {
            0 => -(1 + pick(rng, 3) as i32),                    // partly before the start
            1 => dims[d] as i32 - 1,                            // mostly past the end
            2 if d > 0 => dims[d] as i32 + pick(rng, 2) as i32, // wholly past the end
            _ => pick(rng, dims[d] as usize) as i32,
        })
        .collect();
    let slots = (TMA_OUT_WORDS * 4 - bytes) / 128;
    let offset = 128 * pick(rng, slots.min(12) + 1);
    let source = (0..extent).map(|_| rng.below(256) as u8).collect();
    Case { dtype, source, layout: TmaLayout { dims, strides, box_dims, swizzle, oob }, coords, offset }
}

/// Whether `got` (all of shared memory) holds the case's box; on the emulator also that every
/// other byte still holds the 0xff poison (nothing was written outside the box).
fn check(case: &Case, got: &[u8], emulated: bool, context: &str) {
    let want = case.expected();
    let region = &got[case.offset..case.offset + want.len()];
    if let Some(i) = region.iter().zip(&want).position(|(g, w)| g != w) {
        panic!("{context}: byte {i} of the box is {:#04x}, want {:#04x} ({case:?})", region[i], want[i]);
    }
    if emulated {
        let outside =
            got.iter().enumerate().find(|&(i, &b)| (i < case.offset || i >= case.offset + want.len()) && b != 0xff);
        assert!(outside.is_none(), "{context}: shared byte {:?} outside the box was written", outside.map(|o| o.0));
    }
}

#[test]
fn tensor_copies_land_as_the_isa_lays_them_out_under_every_schedule_and_timing() {
    let mut rng = Rng::new(0x7a3a);
    let gpus = common::devices().into_iter().filter(|d| d.target() == Target::Cuda && d.ptx_arch() == Some("sm_90"));
    let devices: Vec<Device> = devices().into_iter().chain(gpus).collect();
    let (mut seen, mut outside) = (std::collections::BTreeSet::new(), [0usize; 2]);
    for n in 0..40 {
        let case = random_case(&mut rng);
        seen.insert((case.layout.dims.len(), case.layout.swizzle.bytes(), case.dtype.size()));
        let l = &case.layout;
        let partly_outside = (0..l.dims.len())
            .any(|d| case.coords[d] < 0 || i64::from(case.coords[d]) + i64::from(l.box_dims[d]) > l.dims[d] as i64);
        if partly_outside {
            outside[usize::from(l.oob == TmaOobFill::Nan)] += 1;
        }
        // A few cases under every schedule, the rest under two (the copy is issued by one thread).
        let on: &[Device] = if n < 6 { &devices } else { &devices[..2] };
        for device in on {
            let context = format!("case {n}, {device:?}");
            let got = case.run(device, Variant::Correct, 0).unwrap_or_else(|e| panic!("{context}: {e} ({case:?})"));
            check(&case, &got, device.target() == Target::Emulated, &context);
        }
    }
    // The cases covered every rank and swizzle, and boxes reaching outside with either fill.
    assert!(outside.iter().all(|&n| n >= 3), "boxes partly outside (zeros, NaN): {outside:?}");
    for rank in 1..=5 {
        assert!(seen.iter().any(|s| s.0 == rank), "no case of rank {rank}");
    }
    for span in [0, 32, 64, 128] {
        assert!(seen.iter().any(|s| s.1 == span), "no case of swizzle {span}");
    }
}

/// A 2-D bf16 tile of 64-element (128-byte) rows under the 128-byte swizzle, at an offset that
/// is 128-byte but not 1024-byte aligned: the pattern follows the absolute address.
fn tile_case() -> Case {
    let mut rng = Rng::new(5);
    let (rows, cols) = (40usize, 64usize);
    Case {
        dtype: DType::BF16,
        source: (0..rows * cols * 2).map(|_| rng.below(256) as u8).collect(),
        layout: TmaLayout {
            dims: vec![cols as u64, rows as u64],
            strides: vec![cols as u64],
            box_dims: vec![64, 32],
            swizzle: TmaSwizzle::B128,
            oob: TmaOobFill::Zeros,
        },
        coords: vec![0, 16],
        offset: 384,
    }
}

#[test]
fn a_swizzled_tile_follows_the_absolute_shared_address_and_fills_past_the_end() {
    let case = tile_case();
    let got = case.run(&Device::emulated(), Variant::Correct, 0).unwrap();
    check(&case, &got, true, "tile");
    // Rows 16..40 of the tensor are read, rows 40..48 of the box are past its end: zeros.
    let want = case.expected();
    assert!(want[24 * 128..].iter().all(|&b| b == 0) && want[..24 * 128].iter().any(|&b| b != 0));
    // The swizzle moved chunks: an unswizzled reading of the source differs.
    assert_ne!(&want[128..256], &case.source[17 * 128..18 * 128], "row 1 was not permuted");
}

#[test]
fn misuse_is_reported_by_name_under_every_schedule_and_timing() {
    let case = tile_case();
    for (bug, status, words) in [
        (1, "kernel trap", &["complete_tx crossed a phase", "selftest.cu:"][..]),
        (2, "deadlock", &["16 tx bytes pending"][..]),
        (3, "misaligned access", &["128-byte aligned", "selftest.cu:"][..]),
        (4, "kernel trap", &["cp.async.bulk.tensor.3d with a tensor map of rank 2"][..]),
    ] {
        for device in devices() {
            let context = format!("bug {bug}, {device:?}");
            common::assert_reported(
                case.run(&device, Variant::PlantedBug, bug),
                "selftest_tma",
                status,
                words,
                &context,
            );
        }
    }
    // Reading shared memory without waiting shows the in-flight poison (or an error) somewhere.
    let want = case.expected();
    let caught = common::devices_catching(
        &devices(),
        |d| case.run(d, Variant::PlantedBug, 5),
        |got| got[case.offset..case.offset + want.len()] != want[..],
    );
    assert!(caught > 0, "a read before the wait passes under every schedule and timing");
    // A map that was never encoded (all zeros), and a swizzled box narrower than its span.
    let (device, header) = (Device::emulated(), case.header(0));
    let input = Tensor::from_slice(&device, &header, &[TMA_HEADER]).unwrap();
    let out = Tensor::poisoned(&device, DType::F32, &[TMA_OUT_WORDS]).unwrap();
    common::assert_reported(
        selftest::launch(Kernel::Tma, Variant::Correct, Some(&input), &out, 0, 0, 0),
        "selftest_tma",
        "kernel trap",
        &["did not encode"],
        "zero map",
    );
    let mut narrow = case.clone();
    narrow.layout.box_dims[0] = 32;
    common::assert_reported(
        narrow.run(&Device::emulated(), Variant::Correct, 0),
        "selftest_tma",
        "unsupported operation",
        &["narrower than the swizzle span"],
        "narrow swizzled box",
    );
}

#[test]
fn layouts_the_encoder_refuses_are_named_errors_on_every_target() {
    let case = tile_case();
    let mut bad: Vec<(&str, Case)> = Vec::new();
    let mut push = |what: &'static str, f: &dyn Fn(&mut TmaLayout)| {
        let mut c = case.clone();
        f(&mut c.layout);
        bad.push((what, c));
    };
    push("rank 6", &|l| {
        l.dims = vec![64; 6];
        l.strides = vec![64; 5];
        l.box_dims = vec![64; 6];
    });
    push("a box of 257", &|l| l.box_dims[1] = 257);
    push("an empty dimension", &|l| l.dims[1] = 0);
    push("a stride of 8 bytes", &|l| l.strides[0] = 4);
    push("an inner box of 8 bytes", &|l| {
        l.box_dims[0] = 4;
        l.swizzle = TmaSwizzle::None;
    });
    push("a box wider than the swizzle", &|l| {
        l.box_dims[0] = 128;
        l.dims[0] = 128;
        l.strides[0] = 128;
        l.dims[1] = 10;
    });
    push("a map past the tensor", &|l| l.dims[1] = 41);
    push("strides and box of another rank", &|l| l.strides.clear());
    let mut int_nan = case.clone();
    int_nan.dtype = DType::U8;
    int_nan.layout.dims[0] = 128;
    int_nan.layout.strides[0] = 128;
    int_nan.layout.box_dims[0] = 128;
    int_nan.layout.oob = TmaOobFill::Nan;
    bad.push(("a NaN fill of integers", int_nan));
    for device in common::devices() {
        for (what, c) in &bad {
            match c.run(&device, Variant::Correct, 0) {
                Err(Error::InvalidArgument { .. }) => {}
                other => panic!("{what}, {device:?}: {:?}", other.map(|_| "launched")),
            }
        }
    }
}
