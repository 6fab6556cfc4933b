//! Reading SASS: disassembly of the embedded cubins (`cuobjdump`, `nvdisasm` for line tables),
//! the instruction parser, loops, the hot path of a loop without its cold source lines, the
//! instruction mix and the loads in flight before their first use.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// One SASS instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sass {
    pub addr: u32,
    /// Mnemonic with modifiers (`LDG.E.128`), predicate stripped.
    pub op: String,
    /// The operand text.
    pub operands: String,
    /// Whether a guard predicate (`@P0`, `@!P1`) was stripped.
    pub predicated: bool,
}

impl Sass {
    /// The mnemonic without modifiers (`LDG`).
    pub fn base(&self) -> &str {
        self.op.split('.').next().unwrap_or("")
    }
}

/// Runs the toolchain's `tool` (`cuobjdump`, `nvdisasm`) with `args` on `cubin`, written to a
/// temporary file named after (the start of) `tag` and a per-process counter (threads analyzing
/// the same kernel at once never share a file); its standard output.
fn run_on_cubin(tool: &str, args: &[&str], cubin: &[u8], tag: &str) -> Result<String, String> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let bin = std::path::PathBuf::from(llama_kernels::dev::build::CUDA_BIN).join(tool);
    let dir = std::env::temp_dir().join(format!("llk-perf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("temp dir: {e}"))?;
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // A mangled template name can pass the 255 bytes a file name may have: its start will do.
    let tag: String = tag.chars().take(64).collect();
    let path = dir.join(format!("{tag}.{tool}.{n}.cubin"));
    std::fs::write(&path, cubin).map_err(|e| format!("write cubin: {e}"))?;
    let out = Command::new(&bin)
        .args(args)
        .arg(&path)
        .output()
        .map_err(|e| format!("cannot run {} (scripts/setup.sh installs it): {e}", bin.display()))?;
    let _ = std::fs::remove_file(&path);
    if !out.status.success() {
        return Err(format!("{tool} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Disassembles `function` of a cubin with the toolchain's `cuobjdump`.
pub fn disassemble(cubin: &[u8], function: &str) -> Result<Vec<Sass>, String> {
    Ok(parse_sass(&run_on_cubin("cuobjdump", &["-sass", "-fun", function], cubin, function)?))
}

/// Line ranges (1-based, inclusive) of `source` between `// perf-model: cold {` and
/// `// perf-model: cold }` markers.
pub fn cold_ranges(source: &str) -> Vec<(u32, u32)> {
    let mut ranges = Vec::new();
    let mut open = None;
    for (i, line) in source.lines().enumerate() {
        let n = i as u32 + 1;
        if line.contains("perf-model: cold {") {
            open = Some(n);
        } else if line.contains("perf-model: cold }") {
            if let Some(start) = open.take() {
                ranges.push((start, n));
            }
        }
    }
    ranges
}

/// Addresses of `function`'s instructions compiled from a cold line of `file` (a file name such as
/// `attention.cu`), directly or through an inlined call made there: read from the line table the
/// `-lineinfo` build keeps in the cubin (`nvdisasm -gi` prints each instruction's inline chain).
pub fn cold_addresses(
    cubin: &[u8],
    function: &str,
    file: &str,
    ranges: &[(u32, u32)],
) -> Result<BTreeSet<u32>, String> {
    let text = run_on_cubin("nvdisasm", &["-gi"], cubin, function)?;
    let header = format!(".text.{function}:");
    let body = text.split_once(header.as_str()).ok_or(format!("{function} not in the nvdisasm output"))?.1;
    let is_cold =
        |f: &str, line: u32| f.rsplit('/').next() == Some(file) && ranges.iter().any(|&(a, b)| (a..=b).contains(&line));
    // Each `//## File "f", line n [inlined at "g", line m]` line is one frame of the next
    // instruction's chain; an instruction without its own chain keeps the previous one.
    let frame = |l: &str| -> Vec<(String, u32)> {
        l.split("File \"")
            .chain(l.split(" at \"").skip(1))
            .filter_map(|part| {
                let (f, rest) = part.split_once('"')?;
                let n = rest.trim_start_matches(',').trim().strip_prefix("line ")?;
                let n: u32 = n.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
                Some((f.to_string(), n))
            })
            .collect()
    };
    let mut cold = BTreeSet::new();
    let (mut chain_cold, mut fresh) = (false, true);
    for l in body.lines() {
        let t = l.trim_start();
        if t.starts_with(".section") || t.starts_with("//----") {
            break; // the next function
        }
        if let Some(rest) = t.strip_prefix("//##") {
            if fresh {
                chain_cold = false;
                fresh = false;
            }
            chain_cold |= frame(rest).iter().any(|(f, n)| is_cold(f, *n));
        } else if let Some(rest) = t.strip_prefix("/*") {
            let Some((addr, _)) = rest.split_once("*/") else { continue };
            let Ok(addr) = u32::from_str_radix(addr.trim(), 16) else { continue };
            if chain_cold {
                cold.insert(addr);
            }
            fresh = true;
        }
    }
    Ok(cold)
}

/// A wgmma main loop, found by its partial wait (`WARPGROUP.DEPBAR.LE gsb0, 0x1`: every group
/// but the newest has completed; in a flash-attention loop, S = Q K^T waited for while the P V
/// issued behind it still runs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgmmaLoop {
    /// The innermost loop around the partial wait, every path (a branched-over mask included).
    pub body: Mix,
    /// What the thread runs between the partial wait and the next wait: beside the P V.
    pub beside: Mix,
    /// The loop's first and last instruction addresses.
    pub span: (u32, u32),
}

/// The wgmma main loops of a function, in address order: one per partial wait inside a loop.
pub fn wgmma_loops(code: &[Sass]) -> Vec<WgmmaLoop> {
    let is_wait = |i: &Sass| i.op == "WARPGROUP.DEPBAR.LE";
    let spans = loops(code);
    let mut out = Vec::new();
    for (at, wait) in code.iter().enumerate() {
        if !is_wait(wait) || !wait.operands.replace(' ', "").starts_with("gsb0,0x1") {
            continue;
        }
        let inner = spans.iter().filter(|(t, e)| *t <= wait.addr && wait.addr <= *e).min_by_key(|(t, e)| e - t);
        let Some(&(top, end)) = inner else { continue };
        out.push(WgmmaLoop {
            body: Mix::of(code.iter().filter(|i| top <= i.addr && i.addr <= end)),
            beside: Mix::of(code[at + 1..].iter().take_while(|i| !is_wait(i))),
            span: (top, end),
        });
    }
    out
}

/// Parses `cuobjdump -sass` text (one function) into instructions.
pub fn parse_sass(text: &str) -> Vec<Sass> {
    let mut v = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        let Some(rest) = t.strip_prefix("/*") else { continue };
        let Some((addr, code)) = rest.split_once("*/") else { continue };
        let Ok(addr) = u32::from_str_radix(addr.trim(), 16) else { continue };
        let code = code.trim().trim_end_matches(|c| c != ';').trim_end_matches(';').trim();
        let mut words = code.split_whitespace().peekable();
        let predicated = words.peek().is_some_and(|w| w.starts_with('@'));
        if predicated {
            words.next();
        }
        let Some(op) = words.next() else { continue };
        let operands = words.collect::<Vec<_>>().join(" ");
        v.push(Sass { addr, op: op.to_string(), operands, predicated });
    }
    v
}

/// The address a branch (`BRA 0x1a50`, `BRA P2, 0x1a50`) jumps to.
fn branch_target(i: &Sass) -> Option<u32> {
    if i.base() != "BRA" {
        return None;
    }
    let target = i.operands.split_whitespace().last()?.trim_start_matches("0x");
    u32::from_str_radix(target.trim_end_matches(';'), 16).ok()
}

/// `[start, end]` address ranges of loop bodies (a branch back to an earlier address). The return
/// of a divergence slow path (`WARPSYNC.COLLECTIVE` ... `ENDCOLLECTIVE`, then a branch back to the
/// `BRA.DIV` that left the fast path, which ptxas emits for `__syncwarp` and shuffles it cannot
/// prove convergent) is not a loop.
pub fn loops(code: &[Sass]) -> Vec<(u32, u32)> {
    let after_collective = |k: usize| {
        code[..k]
            .iter()
            .rev()
            .find(|i| i.base() != "NOP")
            .is_some_and(|i| i.op.starts_with("WARPSYNC.COLLECTIVE") || i.op.starts_with("ENDCOLLECTIVE"))
    };
    code.iter()
        .enumerate()
        .filter(|&(k, _)| !after_collective(k))
        .filter_map(|(_, i)| branch_target(i).filter(|&t| t < i.addr).map(|t| (t, i.addr)))
        .collect()
}

/// The hot path of a loop body (`region`, in address order): the basic blocks one iteration can
/// reach from the loop head along forward edges without entering a cold block, a block whose
/// instructions mostly come from cold source lines. Deciding per block rather than per
/// instruction keeps out the values ptxas rematerializes inside cold code, which the line table
/// attributes to the line that defined them. Both sides of a branch between hot blocks count
/// (the O rescale a warp skips when no row maximum moved, for one), so the path is an upper
/// bound on what an interior tile issues.
pub fn hot_path<'a>(region: &[&'a Sass], cold: &BTreeSet<u32>) -> Vec<&'a Sass> {
    let Some(first) = region.first() else { return Vec::new() };
    let mut leaders = BTreeSet::from([first.addr]);
    for (k, i) in region.iter().enumerate() {
        if let Some(t) = branch_target(i) {
            leaders.insert(t);
            if let Some(next) = region.get(k + 1) {
                leaders.insert(next.addr);
            }
        }
    }
    let mut blocks: Vec<Vec<&'a Sass>> = Vec::new();
    for &i in region {
        match blocks.last_mut() {
            Some(b) if !leaders.contains(&i.addr) => b.push(i),
            _ => blocks.push(vec![i]),
        }
    }
    let start: BTreeMap<u32, usize> = blocks.iter().enumerate().map(|(k, b)| (b[0].addr, k)).collect();
    let is_cold: Vec<bool> = blocks
        .iter()
        .map(|b| {
            let body: Vec<_> = b.iter().filter(|i| i.base() != "BRA" && i.base() != "NOP").collect();
            let n = body.iter().filter(|i| cold.contains(&i.addr)).count();
            2 * n > body.len()
        })
        .collect();
    let mut reach = vec![false; blocks.len()];
    reach[0] = true;
    for k in 0..blocks.len() {
        if !reach[k] || is_cold[k] {
            continue;
        }
        let Some(last) = blocks[k].last() else { continue };
        let target = branch_target(last);
        if (target.is_none() || last.predicated) && k + 1 < blocks.len() {
            reach[k + 1] = true;
        }
        if let Some(&j) = target.filter(|&t| t > last.addr).and_then(|t| start.get(&t)) {
            reach[j] = true;
        }
    }
    blocks.iter().enumerate().filter(|&(k, _)| reach[k] && !is_cold[k]).flat_map(|(_, b)| b.iter().copied()).collect()
}

/// Instruction counts of a region.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mix {
    /// Every instruction except NOP.
    pub total: usize,
    pub hmma: usize,
    /// wgmma (HGMMA, sm_90a).
    pub hgmma: usize,
    pub ldsm: usize,
    pub ldgsts: usize,
    pub mufu: usize,
    pub lds: usize,
    pub sts: usize,
    /// Global loads and stores by width in bits.
    pub ldg: BTreeMap<u32, usize>,
    pub stg: BTreeMap<u32, usize>,
    /// Local-memory accesses (spills or stack arrays).
    pub local: usize,
    /// Of which stores (STL).
    pub local_stores: usize,
}

fn width(op: &str) -> u32 {
    op.split('.').find_map(|m| m.parse::<u32>().ok().filter(|w| [8, 16, 32, 64, 128].contains(w))).unwrap_or(32)
}

impl Mix {
    pub fn of<'a>(code: impl IntoIterator<Item = &'a Sass>) -> Mix {
        let mut m = Mix::default();
        for i in code {
            match i.base() {
                "NOP" => continue,
                "HMMA" => m.hmma += 1,
                "HGMMA" => m.hgmma += 1,
                "LDSM" => m.ldsm += 1,
                "LDGSTS" => m.ldgsts += 1,
                "MUFU" => m.mufu += 1,
                "LDS" => m.lds += 1,
                "STS" => m.sts += 1,
                "LDG" => *m.ldg.entry(width(&i.op)).or_default() += 1,
                "STG" => *m.stg.entry(width(&i.op)).or_default() += 1,
                "LDL" => m.local += 1,
                "STL" => {
                    m.local += 1;
                    m.local_stores += 1;
                }
                _ => {}
            }
            m.total += 1;
        }
        m
    }
    pub(crate) fn widths(map: &BTreeMap<u32, usize>) -> String {
        if map.is_empty() {
            return "-".into();
        }
        map.iter().map(|(w, n)| format!("{n}x{w}")).collect::<Vec<_>>().join(" ")
    }
}

/// The number of 128-bit global loads issued before the first instruction that reads one of
/// their destination registers: the loads one thread keeps in flight at the start of the kernel.
pub fn loads_in_flight(code: &[Sass]) -> usize {
    in_flight(code, false).0
}

/// The bytes of global loads of every width (32-bit scalar loads too) one thread issues before the
/// first instruction that reads one of their destinations: what it keeps in flight at the start.
pub fn load_bytes_in_flight(code: &[Sass]) -> usize {
    in_flight(code, true).1
}

/// (128-bit loads, their bytes) issued before the first use of one of them; with `any_width`, loads
/// of every width count (and a use of any of them ends the scan).
fn in_flight(code: &[Sass], any_width: bool) -> (usize, usize) {
    let reg = |s: &str| -> Option<u32> {
        s.trim_matches(|c: char| !c.is_ascii_alphanumeric()).strip_prefix('R')?.parse().ok()
    };
    let mut pending: Vec<(u32, u32)> = Vec::new(); // destination register ranges
    let (mut best, mut bytes) = (0, 0);
    for i in code {
        let mut ops = i.operands.split(',').map(str::trim);
        let (dest, sources): (Option<&str>, Vec<&str>) = match i.base() {
            "STG" | "STS" | "STL" | "BRA" | "EXIT" | "BAR" => (None, i.operands.split(',').map(str::trim).collect()),
            _ => (ops.next(), ops.collect()),
        };
        // Address operands of loads ([R10.64]) are sources too.
        let mut read = false;
        for s in sources.iter().chain(dest.filter(|d| d.starts_with('[')).iter()) {
            for tok in s.split(['[', ']', ' ', '.']) {
                if let Some(r) = reg(tok) {
                    read |= pending.iter().any(|&(lo, hi)| (lo..=hi).contains(&r));
                }
            }
        }
        if read {
            break;
        }
        if i.op.starts_with("LDG") && (any_width || width(&i.op) == 128) {
            if let Some(r) = dest.and_then(reg) {
                let w = width(&i.op);
                pending.push((r, r + (w / 32).max(1) - 1));
                bytes += w as usize / 8;
                if w == 128 {
                    best += 1;
                }
            }
        }
    }
    (best, bytes)
}
