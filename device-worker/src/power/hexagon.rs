//! Hexagon NPU backend (Snapdragon phones), **designed, not built here** (feature `hexagon`,
//! off by default). Enabling the feature stops the build with the `compile_error!` below:
//! the Hexagon SDK headers and libraries (`HAP_power.h`, `remote.h`, `libcdsprpc.so`) and an
//! Android NDK toolchain are not available in this workspace, and a backend that pretends to
//! vote would make the idle-power figures lie.
//!
//! # What it would call, and why
//!
//! The votes live on the DSP side: our FastRPC skeleton (the DSP half of the kernel library,
//! loaded through `remote_handle64_open("file:///libtandem_skel.so?tandem_skel_handle_invoke&_modver=1.0&_dom=cdsp")`)
//! would export one method, `tandem_power_vote(handle, const votes*)`, which runs on the cDSP and
//! calls `HAP_power_set(context, &request)` (`HAP_power.h`) with:
//!
//! 1. **DCVS v3** (`request.type = HAP_power_set_DCVS_v3`, payload `HAP_power_dcvs_v3_payload`):
//!    - active: `set_dcvs_enable = TRUE, dcvs_enable = FALSE` (no governor ramp-down during a
//!      batch), `set_core_params = TRUE` with `min_corner = max_corner = target_corner =
//!      HAP_DCVS_VCORNER_TURBO` ([`ClockLevel::Turbo`](super::ClockLevel)) or `..._NOM`,
//!      `set_bus_params = TRUE` with the same corners for the bus (memory bandwidth / DDR
//!      performance mode, [`Votes::memory_perf`](super::Votes)).
//!    - released: `dcvs_enable = TRUE`, corners `HAP_DCVS_VCORNER_DISABLE` (the governor owns
//!      the clocks again).
//! 2. **Sleep disable** (the same DCVS v3 payload): `set_sleep_disable = TRUE, sleep_disable =
//!    1` while active (the DSP does not power-collapse between micro-batches; the
//!    wake-latency request of [`Votes::wake_latency_us`](super::Votes)), `sleep_disable = 0` on
//!    release. `set_latency/latency` carries the µs value.
//! 3. **HMX power** (`request.type = HAP_power_set_HMX`, `hmx.power_up = TRUE/FALSE`): the
//!    matrix unit is powered only while votes are held ([`Votes::matrix_unit`](super::Votes)).
//!
//! On the CPU side, `remote_handle64_control(handle, DSPRPC_CONTROL_LATENCY,
//! &remote_rpc_control_latency{ enable = RPC_PM_QOS, latency = 100 }, sizeof ..)` keeps the
//! FastRPC call path itself out of deep CPU idle while active, and `enable = RPC_DISABLE_QOS` on
//! release. `wait_recovered` would time a no-op FastRPC call until it returns within 1 ms
//! (recovery after a release is 2–4 ms on the NPU, DESIGN.md).
//!
//! Votes are sent from the engine thread (the FastRPC handle is not shared), inside the idle
//! controller's lock like every backend's.

compile_error!(
    "the `hexagon` power backend needs the Hexagon SDK (HAP_power.h, remote.h, libcdsprpc.so) \
     and an Android NDK toolchain, which this build does not have; see src/power/hexagon.rs \
     for the design"
);
