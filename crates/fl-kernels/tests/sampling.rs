//! sampling::{sample, process_logits, decode_update, philox_words}: the kernel layer's own
//! checks (every argument it refuses, named) and the launchers' contracts. The sampling
//! results themselves are compared with the CPU reference in `fl-sampling`'s tests, which
//! launch through this layer.

use fl_kernels::sampling::{
    self, DecodeBuffers, PenaltyWorkspace, ProcessInputs, SampleInputs, SampleWorkspace,
    MAX_SPLIT_ROWS, MAX_VOCAB, PARAM_WORDS,
};
use fl_kernels::testing::gpu_or_skip;
use fl_kernels::{DeviceTensor, Error};

/// The argument an error names (Shape, InvalidArgument or TooLarge).
fn arg_of(e: Error) -> &'static str {
    match e {
        Error::Shape { arg, .. }
        | Error::InvalidArgument { arg, .. }
        | Error::TooLarge { arg, .. } => arg,
        e => panic!("not an argument error: {e}"),
    }
}

// ---------------------------------------------------------------- no GPU

#[test]
fn safe_workspace_sizes_match_the_launchers() {
    assert_eq!(MAX_VOCAB, 1 << 23);
    assert_eq!(MAX_SPLIT_ROWS, 128);
    assert_eq!(PARAM_WORDS, 16);
    assert_eq!(sampling::sample_workspace_size(1, 2048).unwrap(), 0);
    assert_eq!(sampling::sample_workspace_size(129, 128_256).unwrap(), 0);
    let one = sampling::sample_workspace_size(1, 2049).unwrap();
    assert!(one > 0);
    assert_eq!(
        sampling::sample_workspace_size(128, 128_256).unwrap(),
        128 * sampling::sample_workspace_size(1, 128_256).unwrap()
    );
    assert_eq!(
        sampling::penalty_workspace_size(1000).unwrap(),
        32 * 1000 * 4
    );
    for vocab in [0, MAX_VOCAB + 1] {
        assert_eq!(
            arg_of(sampling::sample_workspace_size(1, vocab).unwrap_err()),
            "vocab"
        );
        assert_eq!(
            arg_of(sampling::penalty_workspace_size(vocab).unwrap_err()),
            "vocab"
        );
    }
}

#[test]
fn workspace_sizes_and_launcher_argument_checks() {
    use fl_kernels_sys as sys;
    // SAFETY: pure functions of their integer arguments.
    unsafe {
        // no split (hence no scratch) for small vocabularies or large batches
        assert_eq!(sys::fl_sample_workspace_size(1, 2048), 0);
        assert_eq!(sys::fl_sample_workspace_size(129, 128_256), 0);
        let one = sys::fl_sample_workspace_size(1, 2049);
        assert!(one > 0);
        assert_eq!(sys::fl_sample_workspace_size(128, 128_256), 128 * one);
        assert_eq!(sys::fl_sample_workspace_size(-1, 10), -1);
        assert_eq!(sys::fl_sample_workspace_size(1, 0), -1);
        assert_eq!(sys::fl_sample_workspace_size(1, (1 << 23) + 1), -1);
        assert_eq!(sys::fl_penalty_workspace_size(1000), 32 * 1000 * 4);
        assert_eq!(sys::fl_penalty_workspace_size(0), -1);
    }
    let f32_id = sys::fl_dtype::FL_DTYPE_F32;
    let invalid = sys::FL_ERR_INVALID_ARGUMENT;
    let null = std::ptr::null_mut::<std::ffi::c_void>();
    // SAFETY: every call is refused on its scalar arguments before any pointer is used.
    unsafe {
        let st = sys::fl_sample(
            f32_id,
            null,
            1,
            0,
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
            0,
            std::ptr::null_mut(),
            null,
            0,
            null,
        );
        assert_eq!(st, invalid, "vocab 0");
        let st = sys::fl_sample(
            f32_id,
            null,
            2,
            10,
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
            0,
            std::ptr::null_mut(),
            null,
            0,
            null,
        );
        assert_eq!(st, invalid, "null logits");
        let st = sys::fl_sample(
            f32_id,
            null,
            0,
            10,
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
            0,
            std::ptr::null_mut(),
            null,
            0,
            null,
        );
        assert_eq!(st, sys::FL_OK as i32, "empty batch");
        let st = sys::fl_process_logits(
            f32_id,
            null,
            1,
            10,
            std::ptr::null(),
            std::ptr::null(),
            std::ptr::null(),
            -1,
            std::ptr::null(),
            0,
            std::ptr::null(),
            std::ptr::null(),
            0,
            null,
            0,
            null,
        );
        assert_eq!(st, invalid, "negative max_history");
        let st = sys::fl_decode_update(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            3,
            std::ptr::null(),
            std::ptr::null(),
            0,
            0,
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            null,
        );
        assert_eq!(st, invalid, "null state");
        let st = sys::fl_philox_words(
            std::ptr::null(),
            std::ptr::null(),
            2,
            std::ptr::null_mut(),
            null,
        );
        assert_eq!(st, invalid, "null params");
    }
}

// ---------------------------------------------------------------- GPU

/// Every tensor argument of the four launchers, each given a wrong shape in turn, is
/// refused before launch and named; the right shapes launch (greedy picks the argmax,
/// bookkeeping counts it).
#[test]
fn sampling_layer_names_every_bad_argument() {
    let Some(gpu) = gpu_or_skip("sampling_layer_names_every_bad_argument") else {
        return;
    };
    let s = gpu.stream();
    let (batch, vocab) = (2usize, 8usize);
    let z_i32 = |shape: &[usize]| DeviceTensor::<i32>::zeros(s, shape).unwrap();
    let z_u8 = |shape: &[usize]| DeviceTensor::<u8>::zeros(s, shape).unwrap();
    let mut host = vec![0.0f32; batch * vocab];
    host[3] = 1.0;
    host[vocab + 6] = 1.0;
    let logits = DeviceTensor::from_host(s, &host, &[batch, vocab]).unwrap();
    // temperature 0 in word 0 of every record: greedy
    let params = z_i32(&[batch, PARAM_WORDS]);
    let mut ws = SampleWorkspace::new(s, batch, vocab).unwrap();
    let mut tokens = z_i32(&[batch]);

    // sample
    let flat = DeviceTensor::<f32>::zeros(s, &[batch * vocab]).unwrap();
    let e = sampling::sample(s, &flat, &SampleInputs::default(), &mut tokens, &mut ws);
    assert_eq!(arg_of(e.unwrap_err()), "logits");
    let narrow = z_i32(&[batch, PARAM_WORDS - 1]);
    let steps_bad = z_i32(&[batch + 1]);
    let fin_bad = z_u8(&[1]);
    for (inputs, want) in [
        (
            SampleInputs {
                params: Some(&narrow),
                ..Default::default()
            },
            "params",
        ),
        (
            SampleInputs {
                steps: Some(&steps_bad),
                ..Default::default()
            },
            "steps",
        ),
        (
            SampleInputs {
                finished: Some(&fin_bad),
                ..Default::default()
            },
            "finished",
        ),
    ] {
        let e = sampling::sample(s, &logits, &inputs, &mut tokens, &mut ws);
        assert_eq!(arg_of(e.unwrap_err()), want);
    }
    let mut tokens_bad = z_i32(&[batch, 1]);
    let e = sampling::sample(
        s,
        &logits,
        &SampleInputs::default(),
        &mut tokens_bad,
        &mut ws,
    );
    assert_eq!(arg_of(e.unwrap_err()), "tokens");
    // a row long enough to split needs scratch; one made for no split is refused
    let long = DeviceTensor::<f32>::zeros(s, &[1, 4096]).unwrap();
    let mut one = z_i32(&[1]);
    let mut small = SampleWorkspace::new(s, 1, 8).unwrap();
    let e = sampling::sample(s, &long, &SampleInputs::default(), &mut one, &mut small);
    assert_eq!(arg_of(e.unwrap_err()), "workspace");
    let inputs = SampleInputs {
        params: Some(&params),
        ..Default::default()
    };
    sampling::sample(s, &logits, &inputs, &mut tokens, &mut ws).unwrap();
    assert_eq!(tokens.to_host(s).unwrap(), vec![3, 6]);

    // process_logits
    let mut lg = DeviceTensor::<f32>::zeros(s, &[batch, vocab]).unwrap();
    let hist = z_i32(&[batch, 4]);
    let hist_bad = z_i32(&[batch + 1, 4]);
    let lens = z_i32(&[batch]);
    let banned_bad = z_i32(&[1, 3]);
    let ends_bad = z_i32(&[1, 1]);
    let mut pws = PenaltyWorkspace::new(s, vocab).unwrap();
    let mut pws_other = PenaltyWorkspace::new(s, vocab + 1).unwrap();
    let e = sampling::process_logits(s, &mut lg, &narrow, &ProcessInputs::default(), None);
    assert_eq!(arg_of(e.unwrap_err()), "params");
    let cases: [(ProcessInputs<'_>, bool, &str); 5] = [
        (
            ProcessInputs {
                history: Some(&hist_bad),
                history_lens: Some(&lens),
                ..Default::default()
            },
            true,
            "history",
        ),
        (
            ProcessInputs {
                history: Some(&hist),
                ..Default::default()
            },
            true,
            "history_lens",
        ),
        (
            ProcessInputs {
                history: Some(&hist),
                history_lens: Some(&lens),
                ..Default::default()
            },
            false,
            "workspace",
        ),
        (
            ProcessInputs {
                banned: Some(&banned_bad),
                ..Default::default()
            },
            false,
            "banned",
        ),
        (
            ProcessInputs {
                end_ids: Some(&ends_bad),
                ..Default::default()
            },
            false,
            "end_ids",
        ),
    ];
    for (inputs, with_ws, want) in cases {
        let w = with_ws.then_some(&mut pws);
        let e = sampling::process_logits(s, &mut lg, &params, &inputs, w);
        assert_eq!(arg_of(e.unwrap_err()), want);
    }
    let inputs = ProcessInputs {
        history: Some(&hist),
        history_lens: Some(&lens),
        ..Default::default()
    };
    let e = sampling::process_logits(s, &mut lg, &params, &inputs, Some(&mut pws_other));
    assert_eq!(arg_of(e.unwrap_err()), "workspace");
    sampling::process_logits(s, &mut lg, &params, &inputs, Some(&mut pws)).unwrap();

    // decode_update: every state buffer is checked here, not trusted
    let ends = z_i32(&[0]);
    let mut finished = z_u8(&[batch]);
    let mut lengths = z_i32(&[batch]);
    let mut history = DeviceTensor::<i32>::filled(s, &[batch, 4], -1).unwrap();
    let mut all = z_i32(&[1]);
    let mut short = z_i32(&[batch - 1]);
    let mut short_u8 = z_u8(&[batch - 1]);
    let mut all_bad = z_i32(&[2]);
    let mut hist_rows = z_i32(&[batch + 1, 4]);
    {
        let bufs = DecodeBuffers {
            finished: &mut short_u8,
            lengths: &mut lengths,
            history: None,
            all_finished: None,
        };
        let e = sampling::decode_update(s, &mut tokens, bufs, None, None, 0);
        assert_eq!(arg_of(e.unwrap_err()), "finished");
        let bufs = DecodeBuffers {
            finished: &mut finished,
            lengths: &mut short,
            history: None,
            all_finished: None,
        };
        let e = sampling::decode_update(s, &mut tokens, bufs, None, None, 0);
        assert_eq!(arg_of(e.unwrap_err()), "lengths");
        let bufs = DecodeBuffers {
            finished: &mut finished,
            lengths: &mut lengths,
            history: Some(&mut hist_rows),
            all_finished: None,
        };
        let e = sampling::decode_update(s, &mut tokens, bufs, None, None, 0);
        assert_eq!(arg_of(e.unwrap_err()), "history");
        let bufs = DecodeBuffers {
            finished: &mut finished,
            lengths: &mut lengths,
            history: None,
            all_finished: Some(&mut all_bad),
        };
        let e = sampling::decode_update(s, &mut tokens, bufs, None, None, 0);
        assert_eq!(arg_of(e.unwrap_err()), "all_finished");
        let bufs = DecodeBuffers {
            finished: &mut finished,
            lengths: &mut lengths,
            history: None,
            all_finished: None,
        };
        let e = sampling::decode_update(s, &mut tokens, bufs, Some(&narrow), None, 0);
        assert_eq!(arg_of(e.unwrap_err()), "params");
        let bufs = DecodeBuffers {
            finished: &mut finished,
            lengths: &mut lengths,
            history: None,
            all_finished: None,
        };
        let e = sampling::decode_update(s, &mut tokens, bufs, None, Some(&ends_bad), 0);
        assert_eq!(arg_of(e.unwrap_err()), "end_ids");
        let bufs = DecodeBuffers {
            finished: &mut finished,
            lengths: &mut short,
            history: None,
            all_finished: None,
        };
        let e = sampling::decode_update(s, &mut tokens_bad, bufs, None, None, 0);
        assert_eq!(arg_of(e.unwrap_err()), "tokens");
    }
    let bufs = DecodeBuffers {
        finished: &mut finished,
        lengths: &mut lengths,
        history: Some(&mut history),
        all_finished: Some(&mut all),
    };
    sampling::decode_update(s, &mut tokens, bufs, Some(&params), Some(&ends), 0).unwrap();
    assert_eq!(lengths.to_host(s).unwrap(), vec![1, 1]);
    assert_eq!(
        history.to_host(s).unwrap(),
        vec![3, -1, -1, -1, 6, -1, -1, -1]
    );
    assert_eq!(all.to_host(s).unwrap(), vec![0]);

    // philox_words
    let mut out = z_i32(&[batch, 4]);
    let mut out_bad = z_i32(&[batch, 3]);
    let e = sampling::philox_words(s, &narrow, None, &mut out);
    assert_eq!(arg_of(e.unwrap_err()), "params");
    let e = sampling::philox_words(s, &params, Some(&steps_bad), &mut out);
    assert_eq!(arg_of(e.unwrap_err()), "steps");
    let e = sampling::philox_words(s, &params, None, &mut out_bad);
    assert_eq!(arg_of(e.unwrap_err()), "out");
    sampling::philox_words(s, &params, None, &mut out).unwrap();
}
