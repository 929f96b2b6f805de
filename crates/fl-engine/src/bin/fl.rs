//! The `fl` command.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "fl",
    version,
    about = "FasterLLaMA-rs: LLaMA-family inference on CUDA"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the kernel demo: elementwise kernels checked against the CPU and timed.
    Demo {
        /// Elements per call.
        #[arg(long, default_value_t = 1 << 26)]
        n: usize,
    },
    /// Print the GPU this machine has.
    Info,
}

fn main() {
    let cli = Cli::parse();
    let gpu = match fl_kernels::Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("fl: {e}; this command needs an NVIDIA GPU (compute capability 8.0+)");
            std::process::exit(2);
        }
    };
    let res = match cli.cmd {
        Cmd::Info => info(&gpu),
        Cmd::Demo { n } => demo(&gpu, n),
    };
    if let Err(e) = res {
        eprintln!("fl: {e}");
        std::process::exit(1);
    }
}

fn info(gpu: &fl_kernels::Gpu) -> fl_kernels::Result<()> {
    let (maj, min) = gpu.compute_capability();
    println!(
        "{}: compute capability {maj}.{min}, {} SMs",
        gpu.name()?,
        gpu.sm_count()
    );
    Ok(())
}

fn demo(gpu: &fl_kernels::Gpu, n: usize) -> fl_kernels::Result<()> {
    info(gpu)?;
    if n == 0 {
        return Err(fl_kernels::Error::invalid("--n", "must be at least 1"));
    }
    println!(
        "{:<10} {:>12} {:>10} {:>10} {:>9}",
        "op", "elements", "rel err", "us", "GB/s"
    );
    let mut ok = true;
    for l in fl_engine::demo::run(gpu, n)? {
        println!(
            "{:<10} {:>12} {:>10.2e} {:>10.1} {:>9.0}",
            l.what, l.n, l.rel_err, l.us, l.gbps
        );
        ok &= l.rel_err < 1e-5;
    }
    if !ok {
        return Err(fl_kernels::Error::invalid(
            "demo",
            "a kernel disagreed with its reference",
        ));
    }
    Ok(())
}
