//! Which MPS isolation domain a container joins, and whether its request fits the limits that
//! domain enforces. Pure: tests compare the answers as data.
//!
//! A domain is a set of containers that trust each other and share one MPS control daemon on
//! one GPU. Its daemon's defaults are its enforced limits: under `isolation = "gpu"` the
//! policy's; for a group the admin defined (`[mps.groups.<name>]`) the admin's; otherwise those
//! of the container that created it. NVIDIA's MPS lets a client's own `CUDA_MPS_*` limits only
//! further constrain the daemon's, so a request above the domain's limits is refused and one
//! below them is applied in the container's env (advisory).
//!
//! A group belongs to a tenant: on Kubernetes a group's domain is keyed by the pod's namespace
//! as the CRI set it and the group (`g-<namespace>:<group>`), so the same group name in two
//! namespaces is two domains; `[mps] group_namespaces` may further bind a group to the
//! namespaces that may name it. Elsewhere (podman, Docker, ctr, runc) whoever may run a
//! container names any group (`g-<group>`).

use std::collections::HashMap;

use serde::Serialize;
use thiserror::Error;

use crate::config::Config;
use crate::decide::request::Request;
use crate::vocab::domain::{CONTAINER_PREFIX, GPU_DOMAIN, GROUP_PREFIX};
use crate::vocab::quantity::to_mib;
use crate::vocab::{Isolation, Limits};

/// The domain a container's plan names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedDomain {
    /// Directory and record key: `gpu`, `g-<group>` or `c-<container id>`.
    pub key: String,
    /// The group, for domains of a named group.
    pub group: Option<String>,
    /// The Kubernetes namespace the group's domain belongs to (a CRI container's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The limits this domain enforces if this container creates it.
    pub limits: Limits,
    /// Whether the limits come from the policy (`gpu` isolation or an admin-defined group),
    /// not from the creating container.
    pub from_policy: bool,
}

/// A request that does not fit the policy's isolation or a domain's enforced limits.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DomainError {
    #[error("gpu.share.group {group:?} needs [mps] isolation = \"group\"; this node's policy is isolation = \"{isolation}\". Drop gpu.share.group, or ask the admin to change the policy")]
    GroupNotAllowed { group: String, isolation: Isolation },
    #[error("asks for {what} but MPS domain {domain} on GPU {uuid} enforces {enforced}; ask for {enforced} or less, or use another gpu.share.group")]
    AboveDomain {
        what: String,
        domain: String,
        uuid: String,
        enforced: String,
    },
    #[error(transparent)]
    Namespace(#[from] crate::decide::kube::NamespaceConflict),
    #[error("gpu.share.group {group:?} is bound to Kubernetes namespace(s) {allowed} by [mps] group_namespaces; this container's namespace is {namespace}. Use a group of your namespace, or ask the admin")]
    GroupNotInNamespace {
        group: String,
        allowed: String,
        namespace: String,
    },
    #[error("runs as uid {uid} but MPS domain {domain} on GPU {uuid} serves uid {serving}, and this driver's MPS has no multi-user server; use another gpu.share.group or the same user")]
    OtherUser {
        uid: u32,
        serving: u32,
        domain: String,
        uuid: String,
    },
}

/// The domain of an `mps` container `container` asking for `req` under `cfg`; `annotations`
/// are its spec's, which tell its Kubernetes namespace ([`crate::decide::kube::namespace`]).
///
/// # Errors
/// [`DomainError::GroupNotAllowed`] when a group is named but the policy has no groups;
/// [`DomainError::Namespace`] when a group is named and the spec's namespace keys disagree;
/// [`DomainError::GroupNotInNamespace`] when `[mps] group_namespaces` binds the group to other
/// namespaces.
pub fn choose(
    container: &str,
    req: &Request,
    annotations: &HashMap<String, String>,
    cfg: &Config,
) -> Result<PlannedDomain, DomainError> {
    let isolation = cfg.mps.isolation;
    if let (Some(g), Isolation::Gpu | Isolation::Container) = (&req.group, isolation) {
        return Err(DomainError::GroupNotAllowed {
            group: g.clone(),
            isolation,
        });
    }
    let own = Limits {
        cores: req.cores,
        memory_mib: req
            .memory
            .map(to_mib)
            .or(cfg.gpu_domain_limits().memory_mib),
    };
    Ok(match (isolation, &req.group) {
        (Isolation::Gpu, _) => PlannedDomain {
            key: GPU_DOMAIN.to_owned(),
            group: None,
            namespace: None,
            limits: cfg.gpu_domain_limits(),
            from_policy: true,
        },
        (Isolation::Group, Some(g)) => {
            let namespace = crate::decide::kube::namespace(annotations)?;
            if let Some(allowed) = cfg.mps.group_namespaces.get(g) {
                if !namespace.as_ref().is_some_and(|n| allowed.contains(n)) {
                    return Err(DomainError::GroupNotInNamespace {
                        group: g.clone(),
                        allowed: allowed.join(", "),
                        namespace: namespace
                            .map_or("none (not a Kubernetes pod)".into(), |n| format!("{n:?}")),
                    });
                }
            }
            let key = match &namespace {
                Some(n) => format!("{GROUP_PREFIX}{n}:{g}"),
                None => format!("{GROUP_PREFIX}{g}"),
            };
            let (limits, from_policy) = match cfg.group_limits(g) {
                Some(limits) => (limits, true),
                None => (own, false),
            };
            PlannedDomain {
                key,
                group: Some(g.clone()),
                namespace,
                limits,
                from_policy,
            }
        }
        (Isolation::Group, None) | (Isolation::Container, _) => PlannedDomain {
            key: format!("{CONTAINER_PREFIX}{container}"),
            group: None,
            namespace: None,
            limits: own,
            from_policy: false,
        },
    })
}

/// Whether a container asking for `cores` (when it named them) and `memory` may join a domain
/// that enforces `enforced`.
///
/// # Errors
/// [`DomainError::AboveDomain`] naming the first limit that is exceeded.
pub fn admit(
    domain: &str,
    uuid: &str,
    enforced: &Limits,
    cores: Option<u8>,
    memory_mib: Option<u64>,
) -> Result<(), DomainError> {
    let above = |what: String, enforced: String| DomainError::AboveDomain {
        what,
        domain: domain.to_owned(),
        uuid: uuid.to_owned(),
        enforced,
    };
    if let Some(c) = cores {
        if c > enforced.cores {
            return Err(above(
                format!("gpu.share.cores={c}"),
                format!("{}%", enforced.cores),
            ));
        }
    }
    if let (Some(m), Some(max)) = (memory_mib, enforced.memory_mib) {
        if m > max {
            let size = |mib: u64| crate::vocab::size::human(mib.saturating_mul(1 << 20));
            return Err(above(format!("gpu.share.memory {}", size(m)), size(max)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(cores: Option<u8>, memory: Option<u64>, group: Option<&str>) -> Request {
        Request {
            mode: crate::vocab::Mode::Mps,
            devices: None,
            memory,
            cores: cores.unwrap_or(100),
            cores_explicit: cores.is_some(),
            timeslice: None,
            group: group.map(str::to_owned),
        }
    }

    fn cfg(isolation: Isolation) -> Config {
        let mut c = Config::default();
        c.mps.isolation = isolation;
        c.policy.default_cores = 60;
        c.policy.max_memory = Some("8Gi".into());
        c.mps.groups.insert(
            "admins".into(),
            crate::config::GroupConfig {
                cores: Some(40),
                memory: Some("2Gi".into()),
            },
        );
        c
    }

    #[test]
    fn chosen_domains() {
        let policy = Limits {
            cores: 60,
            memory_mib: Some(8192),
        };
        let rows: Vec<(&str, Isolation, Request, Result<PlannedDomain, DomainError>)> = vec![
            (
                "gpu isolation: one domain with the policy's limits",
                Isolation::Gpu,
                req(Some(30), Some(1 << 30), None),
                Ok(PlannedDomain {
                    key: "gpu".into(),
                    group: None,
                    namespace: None,
                    limits: policy,
                    from_policy: true,
                }),
            ),
            (
                "gpu isolation refuses a group",
                Isolation::Gpu,
                req(None, None, Some("a")),
                Err(DomainError::GroupNotAllowed {
                    group: "a".into(),
                    isolation: Isolation::Gpu,
                }),
            ),
            (
                "container isolation refuses a group",
                Isolation::Container,
                req(None, None, Some("a")),
                Err(DomainError::GroupNotAllowed {
                    group: "a".into(),
                    isolation: Isolation::Container,
                }),
            ),
            (
                "group: the creator's request",
                Isolation::Group,
                req(Some(30), Some(1 << 30), Some("a")),
                Ok(PlannedDomain {
                    key: "g-a".into(),
                    group: Some("a".into()),
                    namespace: None,
                    limits: Limits {
                        cores: 30,
                        memory_mib: Some(1024),
                    },
                    from_policy: false,
                }),
            ),
            (
                "group: no memory asked gives the policy maximum",
                Isolation::Group,
                req(None, None, Some("a")),
                Ok(PlannedDomain {
                    key: "g-a".into(),
                    group: Some("a".into()),
                    namespace: None,
                    limits: Limits {
                        cores: 100,
                        memory_mib: Some(8192),
                    },
                    from_policy: false,
                }),
            ),
            (
                "group defined by the admin",
                Isolation::Group,
                req(Some(10), None, Some("admins")),
                Ok(PlannedDomain {
                    key: "g-admins".into(),
                    group: Some("admins".into()),
                    namespace: None,
                    limits: Limits {
                        cores: 40,
                        memory_mib: Some(2048),
                    },
                    from_policy: true,
                }),
            ),
            (
                "group isolation without a group: alone",
                Isolation::Group,
                req(Some(20), None, None),
                Ok(PlannedDomain {
                    key: "c-c1".into(),
                    group: None,
                    namespace: None,
                    limits: Limits {
                        cores: 20,
                        memory_mib: Some(8192),
                    },
                    from_policy: false,
                }),
            ),
            (
                "container isolation",
                Isolation::Container,
                req(None, Some(2 << 30), None),
                Ok(PlannedDomain {
                    key: "c-c1".into(),
                    group: None,
                    namespace: None,
                    limits: Limits {
                        cores: 100,
                        memory_mib: Some(2048),
                    },
                    from_policy: false,
                }),
            ),
        ];
        for (what, iso, r, want) in rows {
            assert_eq!(choose("c1", &r, &HashMap::new(), &cfg(iso)), want, "{what}");
        }
    }

    fn in_namespace(ns: &str) -> HashMap<String, String> {
        // As containerd's CRI writes it.
        [
            ("io.kubernetes.cri.container-type", "container"),
            ("io.kubernetes.cri.sandbox-namespace", ns),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    #[test]
    fn a_group_belongs_to_its_namespace() {
        let c = cfg(Isolation::Group);
        let r = req(None, None, Some("team-a"));
        let key =
            |ann: &HashMap<String, String>, c: &Config| choose("c1", &r, ann, c).map(|d| d.key);
        let a = key(&in_namespace("team-a"), &c).unwrap();
        let evil = key(&in_namespace("evil"), &c).unwrap();
        assert_eq!(a, "g-team-a:team-a");
        assert_ne!(a, evil, "the same group in two namespaces is two domains");
        assert_ne!(a, key(&HashMap::new(), &c).unwrap(), "nor is a non-CRI one");
        // A pod annotation of the other engine's key cannot move a pod into team-a.
        let mut forged = in_namespace("evil");
        forged.insert("io.kubernetes.pod.namespace".into(), "team-a".into());
        assert!(matches!(
            choose("c1", &r, &forged, &c),
            Err(DomainError::Namespace(_))
        ));
        // Bound by the policy: only the namespaces listed may name it.
        let mut bound = cfg(Isolation::Group);
        bound
            .mps
            .group_namespaces
            .insert("team-a".into(), vec!["team-a".into()]);
        assert_eq!(key(&in_namespace("team-a"), &bound).unwrap(), a);
        for ann in [in_namespace("evil"), HashMap::new()] {
            let e = choose("c1", &r, &ann, &bound).unwrap_err();
            assert!(matches!(e, DomainError::GroupNotInNamespace { .. }), "{e}");
        }
        // The policy key is checked when the policy is read.
        let path = std::path::Path::new("/etc/gpushare/config.toml");
        for (text, ok) in [
            (
                "[mps]\ngroup_namespaces = { team-a = [\"team-a\", \"ops\"] }\n",
                true,
            ),
            ("[mps]\ngroup_namespaces = { team-a = [] }\n", false),
            (
                "[mps]\ngroup_namespaces = { team-a = [\"Team_A\"] }\n",
                false,
            ),
            ("[mps]\ngroup_namespaces = { \"A B\" = [\"a\"] }\n", false),
        ] {
            assert_eq!(Config::parse(text, path).is_ok(), ok, "{text}");
        }
        // A group the policy does not bind stays open to every namespace.
        let other = req(None, None, Some("b"));
        assert!(choose("c1", &other, &in_namespace("evil"), &bound).is_ok());
    }

    #[test]
    fn admission() {
        let enforced = Limits {
            cores: 50,
            memory_mib: Some(1024),
        };
        let unlimited = Limits {
            cores: 100,
            memory_mib: None,
        };
        type Row<'a> = (&'a str, &'a Limits, Option<u8>, Option<u64>, bool);
        let rows: Vec<Row> = vec![
            ("nothing named", &enforced, None, None, true),
            ("below", &enforced, Some(20), Some(512), true),
            ("equal", &enforced, Some(50), Some(1024), true),
            ("cores above", &enforced, Some(51), None, false),
            ("memory above", &enforced, None, Some(1025), false),
            (
                "unlimited memory",
                &unlimited,
                Some(100),
                Some(1 << 30),
                true,
            ),
        ];
        for (what, lim, c, m, ok) in rows {
            assert_eq!(admit("g-a", "GPU-1", lim, c, m).is_ok(), ok, "{what}");
        }
        let e = admit("g-a", "GPU-1", &enforced, Some(80), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "asks for gpu.share.cores=80 but MPS domain g-a on GPU GPU-1 enforces 50%; ask for 50% or less, or use another gpu.share.group"
        );
    }
}
