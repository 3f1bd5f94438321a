//! The OCI hook stages: `createRuntime`/`prestart` (acquire) and `poststop` (release).
//!
//! Failure policy (docs/design.md "Hook stages"): a container that asks for nothing costs almost
//! nothing (no NVML, no lock, no state write) and exits 0; a bad request is refused with one
//! line saying what to change; poststop never fails a delete because of our state.

use std::collections::HashMap;
use std::io::Read;

use crate::config::Config;
use crate::container::error::Error;
use crate::container::intake;
use crate::decide::front::{may_ask, plan_for, RESERVATION_ENV};
use crate::decide::input::{self, SpecView};
use crate::decide::plan::Plan;
use crate::host::acquire::Host;
use crate::host::procinfo::ProcId;
use crate::host::state::StateDir;
use crate::vocab::{Inventory, InventoryError};

/// What a createRuntime call decided.
#[derive(Debug)]
pub enum Outcome {
    /// The container asked for nothing.
    Nothing,
    /// The plan that was carried out (or, with `dry_run`, only made).
    Done(Box<Plan>),
}

/// The container's spec with the state's annotations merged in (the spec's win).
struct Container {
    id: String,
    pid: Option<i32>,
    spec: SpecView,
}

fn container_from(
    state: &crate::decide::oci_state::State,
    bytes: &[u8],
) -> Result<Container, Error> {
    let mut spec = input::parse_spec(bytes, &state.bundle().join("config.json"))?;
    if let Some(extra) = state.annotations() {
        for (k, v) in extra {
            spec.annotations
                .entry(k.clone())
                .or_insert_with(|| v.clone());
        }
    }
    Ok(Container {
        id: state.id().to_owned(),
        pid: *state.pid(),
        spec,
    })
}

/// `createRuntime` / `prestart`: decide from the state on stdin and the bundle's config, then
/// acquire the GPUs. With `dry_run`, only decide. `profile`: the named request of the CDI
/// device that put this hook into the spec (`--profile`), which stands among the container's
/// annotations.
///
/// # Errors
/// [`Error`] for bad input, a refused request, or a failed acquire (which undid itself).
pub fn create_runtime(
    stdin: impl Read,
    cfg: &Config,
    dry_run: bool,
    profile: Option<&str>,
    preread: Option<Preread>,
    open_inventory: &dyn Fn() -> Result<Box<dyn Inventory>, InventoryError>,
) -> Result<Outcome, Error> {
    let state = intake::read_state(stdin)?;
    // A first look's bytes were already found to ask ([`Preread`]): not searched again.
    let (bytes, asked) = match preread.filter(|p| p.bundle == state.bundle()) {
        Some(p) => (p.bytes, true),
        None => (intake::read_config_bytes(state.bundle())?, false),
    };
    let empty = HashMap::new();
    if profile.is_none()
        && !asked
        && !may_ask(&bytes, state.annotations().as_ref().unwrap_or(&empty))
    {
        return Ok(Outcome::Nothing);
    }
    // Set by the spec edit in this hook's own entry, never by the container.
    let reservation = std::env::var(RESERVATION_ENV)
        .ok()
        .filter(|k| crate::vocab::is_safe_name(k));
    let result = decide_and_acquire(
        &state,
        &bytes,
        cfg,
        dry_run,
        profile,
        reservation.as_deref(),
        open_inventory,
    );
    if let (Err(_), Some(key), false) = (&result, reservation.as_deref(), dry_run) {
        // Refused or failed after a spec edit reserved for it: the reservation and the
        // per-container files the edit made go now, not when they expire.
        if key.starts_with(crate::host::pending::PENDING_PREFIX) {
            let inv = crate::host::inventory::Unavailable::new(InventoryError::Unavailable(
                "not needed to drop a reservation".into(),
            ));
            Host::new(cfg, &inv).forget(key);
            crate::container::inject::remove_container_files(cfg, key);
        }
    }
    result
}

/// What the first look at a container found: nothing asked for, or go the whole way.
pub enum Look {
    /// Its state and `config.json` read, and no request in them.
    Nothing,
    /// A request, or input to refuse: run [`create_runtime`], with the `config.json` read here
    /// when there is one (it is not read twice).
    Ask(Option<Preread>),
}

/// A bundle's `config.json` as the first look read it, made only when it may ask for a share
/// (`may_ask`, with the state's annotations): [`create_runtime`] does not search it again.
pub struct Preread {
    bundle: std::path::PathBuf,
    bytes: Vec<u8>,
}

/// Whether the container on `input` (the state the runtime wrote on stdin) plainly asks for
/// nothing: its state and `config.json` read, and no request in them. The binary asks this
/// before it sets anything else up; on [`Look::Ask`] (a request, or input to refuse) it runs
/// [`create_runtime`], which decides the same way and says why.
pub fn look(input: &[u8]) -> Look {
    let Ok(state) = intake::read_state(input) else {
        return Look::Ask(None);
    };
    let Ok(bytes) = intake::read_config_bytes(state.bundle()) else {
        return Look::Ask(None);
    };
    if may_ask(
        &bytes,
        state.annotations().as_ref().unwrap_or(&HashMap::new()),
    ) {
        Look::Ask(Some(Preread {
            bundle: state.bundle().to_owned(),
            bytes,
        }))
    } else {
        Look::Nothing
    }
}

fn decide_and_acquire(
    state: &crate::decide::oci_state::State,
    bytes: &[u8],
    cfg: &Config,
    dry_run: bool,
    profile: Option<&str>,
    reservation: Option<&str>,
    open_inventory: &dyn Fn() -> Result<Box<dyn Inventory>, InventoryError>,
) -> Result<Outcome, Error> {
    let mut c = container_from(state, bytes)?;
    crate::logging::step("spec parsed");
    if let Some(name) = profile {
        let p = crate::decide::profile::find(cfg, name)?;
        crate::decide::profile::given(&c.spec.hooks.create_runtime, &c.spec.process.env, name)?;
        p.apply(&mut c.spec.annotations)?;
    }
    let cgroup = || intake::cgroup_of(c.pid, c.spec.linux.cgroups_path.as_deref(), &c.id);
    // An image without glibc: served where the driver enforces the cap, refused where only the
    // limiter could.
    let seen = crate::container::inject::libc_cache::Seen::default();
    let image = || {
        let rootfs = crate::decide::input::rootfs_of(&c.spec, Some(state.bundle()))
            .unwrap_or_else(|| state.bundle().join("rootfs"));
        crate::container::inject::libc_cache::image_fact(cfg, Some(&rootfs), Some(&seen))
    };
    let Some((plan, inventory)) = plan_for(&c.id, &c.spec, cfg, open_inventory, &cgroup, &image)?
    else {
        return Ok(Outcome::Nothing);
    };
    if dry_run {
        return Ok(Outcome::Done(Box::new(plan)));
    }
    crate::logging::step("planned");
    require_sys_admin(&plan)?;
    let process = match c.pid {
        Some(pid) if pid > 0 => Some(ProcId::of(pid).ok_or(input::InputError::BadPid(pid.into()))?),
        Some(pid) => return Err(input::InputError::BadPid(pid.into()).into()),
        None => None,
    };
    let kube = crate::decide::kube::KubeLabels::from_annotations(&c.spec.annotations);
    let host = Host::new(cfg, inventory.as_ref()).with_labels(kube.clone());
    host.acquire(&plan, process, reservation)?;
    crate::logging::step("acquired");
    // Make the share usable inside the container (mounts into its rootfs), unless a spec edit
    // already added them; undo the acquire if that fails.
    if let Err(e) = crate::container::inject::created::inject(
        &plan,
        cfg,
        &c.spec,
        state.bundle(),
        c.pid,
        Some(&seen),
    ) {
        let _ = host.release(&plan.container);
        crate::container::inject::remove_container_files(cfg, &plan.container);
        return Err(e.into());
    }
    crate::logging::step("mounts made");
    host.flush();
    inventory.remember();
    crate::host::events::note(crate::host::events::acquired(&plan, &kube));
    Ok(Outcome::Done(Box::new(plan)))
}

/// Checks up front for the capability the plan's mounts need, so that a hook run without it
/// says so instead of failing half-way.
fn require_sys_admin(plan: &Plan) -> Result<(), Error> {
    let what = match plan.mode {
        crate::vocab::Mode::Mps => "mount the MPS daemon's shm and pipe directories",
        crate::vocab::Mode::Limit => "mount the limiter into the container",
        crate::vocab::Mode::Timeslice if plan.uses_limiter() => {
            "mount the limiter that keeps the container's memory cap into the container"
        }
        crate::vocab::Mode::Timeslice => return Ok(()),
    };
    match caps::has_cap(
        None,
        caps::CapSet::Effective,
        caps::Capability::CAP_SYS_ADMIN,
    ) {
        Ok(true) => Ok(()),
        _ => Err(Error::NoSysAdmin(what)),
    }
}

/// `poststop`: release the container from every GPU. Returns warnings; never fails because of
/// gpushare's own state.
///
/// # Errors
/// Only for unreadable input (no container id to release).
pub fn poststop(
    stdin: impl Read,
    cfg: &Config,
    open_inventory: &dyn Fn() -> Result<Box<dyn Inventory>, InventoryError>,
) -> Result<Vec<String>, Error> {
    let state = intake::read_state(stdin)?;
    crate::container::inject::remove_container_files(cfg, state.id());
    let sd = StateDir::new(&cfg.state_dir);
    // Pending directories of precreate runs whose create failed before any hook ran.
    crate::host::pending::sweep_pending(&sd, crate::host::pending::PENDING_MAX_AGE);
    // Cheap check first: a container that holds nothing needs no NVML.
    let holds = sd.list_records_lazy().iter().any(|(_, r)| {
        r.as_ref()
            .map_or(true, |r| r.clients.contains_key(state.id()))
    });
    if !holds {
        return Ok(Vec::new());
    }
    // Without NVML compute modes cannot be restored, but records still must be. An inventory
    // that loads NVML on first use says so only when the release needed it.
    let inventory: Box<dyn Inventory> =
        open_inventory().unwrap_or_else(|e| Box::new(crate::host::inventory::Unavailable::new(e)));
    let mut warnings = Host::new(cfg, inventory.as_ref()).release(state.id());
    if let Some(why) = inventory.unavailable() {
        warnings.push(format!(
            "NVML unavailable, compute modes not restored: {}",
            crate::vocab::chain(why)
        ));
    }
    Ok(warnings)
}
