//! Where a request's values come from: the spec's `gpu.share*` annotations, with the
//! `GPU_SHARE*` env as fallback (annotations win), and which containers never ask (a pod's
//! sandbox).

use std::collections::HashMap;

use super::RequestError;

/// The annotation that turns sharing on.
pub const ANNOTATION: &str = "gpu.share";
pub(super) const PREFIX: &str = "gpu.share.";
/// Largest annotation or env value read.
const MAX_VALUE_LEN: usize = 4096;
/// Annotations (key, value) by which CRI runtimes mark a pod's sandbox ("pause", infra)
/// container: containerd's CRI plugin and CRI-O. Such a container holds the pod's namespaces
/// and runs no workload; it carries the pod's `gpu.share*` annotations too when the runtime
/// passes pod annotations on, and is never a share request.
pub const SANDBOX_MARKERS: [(&str, &str); 2] = [
    ("io.kubernetes.cri.container-type", "sandbox"),
    ("io.kubernetes.cri-o.ContainerType", "sandbox"),
];

/// One request field: its annotation name and env fallback.
pub(super) struct Field {
    pub(super) annotation: &'static str,
    pub(super) env: &'static str,
}

pub(super) const MODE: Field = Field {
    annotation: "gpu.share",
    env: "GPU_SHARE",
};
pub(super) const DEVICES: Field = Field {
    annotation: "gpu.share.devices",
    env: "GPU_SHARE_DEVICES",
};
pub(super) const MEMORY: Field = Field {
    annotation: "gpu.share.memory",
    env: "GPU_SHARE_MEMORY",
};
pub(super) const CORES: Field = Field {
    annotation: "gpu.share.cores",
    env: "GPU_SHARE_CORES",
};
pub(super) const TIMESLICE: Field = Field {
    annotation: "gpu.share.timeslice",
    env: "GPU_SHARE_TIMESLICE",
};
pub(super) const GROUP: Field = Field {
    annotation: "gpu.share.group",
    env: "GPU_SHARE_GROUP",
};
pub(super) const FIELDS: [&Field; 6] = [&MODE, &DEVICES, &MEMORY, &CORES, &TIMESLICE, &GROUP];

/// Every annotation a request is read from (for an engine's list of annotations it passes on).
pub fn annotation_keys() -> [&'static str; 6] {
    FIELDS.map(|f| f.annotation)
}

/// The two sources of a request: the spec's annotations and its `process.env`.
pub struct Sources<'a> {
    pub annotations: &'a HashMap<String, String>,
    pub env: &'a [String],
}

impl Sources<'_> {
    /// The value of `field` and the key it came from; annotations win over env.
    pub(super) fn get(
        &self,
        field: &Field,
        env_fallback: bool,
    ) -> Result<Option<(&'static str, String)>, RequestError> {
        let found = if let Some(v) = self.annotations.get(field.annotation) {
            Some((field.annotation, v.as_str()))
        } else if env_fallback {
            env_lookup(self.env, field.env).map(|v| (field.env, v))
        } else {
            None
        };
        match found {
            Some((key, v)) if v.len() > MAX_VALUE_LEN => Err(RequestError::TooLong {
                key: key.to_owned(),
            }),
            // Values are taken exactly as written (README "Request grammar"): no trimming.
            Some((key, v)) => Ok(Some((key, v.to_owned()))),
            None => Ok(None),
        }
    }
}

/// Finds `NAME=value` in a `process.env` list; the last occurrence wins, as in execve.
pub fn env_lookup<'a>(env: &'a [String], name: &str) -> Option<&'a str> {
    env.iter().rev().find_map(|kv| {
        kv.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('='))
    })
}

/// Whether the annotations mark a pod's sandbox container ([`SANDBOX_MARKERS`]).
pub fn is_sandbox(annotations: &HashMap<String, String>) -> bool {
    SANDBOX_MARKERS
        .iter()
        .any(|(k, v)| annotations.get(*k).is_some_and(|a| a == v))
}

/// Quick check, without validation, whether a container asks for sharing at all. Used on the
/// fast path so that containers which ask for nothing cost almost nothing. A pod's sandbox
/// container never does.
pub fn wants_share(src: &Sources<'_>, env_fallback: bool) -> bool {
    if is_sandbox(src.annotations) {
        return false;
    }
    let v = src
        .annotations
        .get(ANNOTATION)
        .map(String::as_str)
        .or_else(|| {
            env_fallback
                .then(|| env_lookup(src.env, MODE.env))
                .flatten()
        });
    let any_sub = src.annotations.keys().any(|k| k.starts_with(PREFIX));
    match v {
        Some(v) => !v.is_empty() && v != "none" || any_sub,
        None => any_sub,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn run(ann: &[(&str, &str)], env: &[&str], cfg: &Config) -> bool {
        let annotations: HashMap<String, String> = ann
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env: Vec<String> = env.iter().map(|s| s.to_string()).collect();
        super::super::parse(
            &Sources {
                annotations: &annotations,
                env: &env,
            },
            cfg,
        )
        .unwrap()
        .is_some()
    }

    #[test]
    fn a_value_may_be_as_long_as_the_limit_and_no_longer() {
        let field = Field {
            annotation: "gpu.share.group",
            env: "GPU_SHARE_GROUP",
        };
        for (len, ok) in [(MAX_VALUE_LEN, true), (MAX_VALUE_LEN + 1, false)] {
            let v = "g".repeat(len);
            let annotations: HashMap<String, String> =
                [("gpu.share.group".to_owned(), v.clone())].into();
            let env = vec![format!("GPU_SHARE_GROUP={v}")];
            for src in [
                Sources {
                    annotations: &annotations,
                    env: &[],
                },
                Sources {
                    annotations: &HashMap::new(),
                    env: &env,
                },
            ] {
                match src.get(&field, true) {
                    Ok(Some((_, got))) => assert!(ok && got == v, "{len} bytes taken"),
                    Err(RequestError::TooLong { key }) => {
                        assert!(!ok, "{len} bytes refused");
                        assert!(key.to_lowercase().contains("group"), "{key}");
                    }
                    other => panic!("{len} bytes: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn pod_sandbox_containers_are_never_share_requests() {
        let cfg = Config::default();
        // (description, annotations, env, asks)
        type Row<'a> = (&'a str, Vec<(&'a str, &'a str)>, Vec<&'a str>, bool);
        let rows: Vec<Row> = vec![
            (
                "containerd sandbox with the pod's mps annotation",
                vec![
                    ("io.kubernetes.cri.container-type", "sandbox"),
                    ("gpu.share", "mps"),
                ],
                vec![],
                false,
            ),
            (
                "CRI-O sandbox with the pod's limit annotations",
                vec![
                    ("io.kubernetes.cri-o.ContainerType", "sandbox"),
                    ("gpu.share", "limit"),
                    ("gpu.share.memory", "1Gi"),
                ],
                vec![],
                false,
            ),
            (
                "sandbox with a key this node does not know",
                vec![
                    ("io.kubernetes.cri.container-type", "sandbox"),
                    ("gpu.share", "mps"),
                    ("gpu.share.colour", "red"),
                ],
                vec![],
                false,
            ),
            (
                "sandbox with a bad mode",
                vec![
                    ("io.kubernetes.cri-o.ContainerType", "sandbox"),
                    ("gpu.share", "turbo"),
                ],
                vec![],
                false,
            ),
            (
                "sandbox with the env fallback",
                vec![("io.kubernetes.cri.container-type", "sandbox")],
                vec!["GPU_SHARE=mps"],
                false,
            ),
            (
                "containerd workload container",
                vec![
                    ("io.kubernetes.cri.container-type", "container"),
                    ("gpu.share", "mps"),
                ],
                vec![],
                true,
            ),
            (
                "CRI-O workload container",
                vec![
                    ("io.kubernetes.cri-o.ContainerType", "container"),
                    ("gpu.share", "limit"),
                ],
                vec![],
                true,
            ),
            (
                "marker value is not sandbox",
                vec![
                    ("io.kubernetes.cri.container-type", "Sandbox "),
                    ("gpu.share", "mps"),
                ],
                vec![],
                true,
            ),
            (
                "the CRI-O key spelt in containerd's style is not a marker",
                vec![
                    ("io.kubernetes.cri-o.container-type", "sandbox"),
                    ("gpu.share", "mps"),
                ],
                vec![],
                true,
            ),
        ];
        for (what, ann, env, asks) in rows {
            let annotations: HashMap<String, String> = ann
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let env_v: Vec<String> = env.iter().map(|s| s.to_string()).collect();
            let src = Sources {
                annotations: &annotations,
                env: &env_v,
            };
            assert_eq!(wants_share(&src, true), asks, "{what}: wants_share");
            assert_eq!(run(&ann, &env, &cfg), asks, "{what}: parse");
        }
    }

    #[test]
    fn fast_check() {
        let none = HashMap::new();
        let env = vec!["GPU_SHARE=mps".to_string()];
        assert!(wants_share(
            &Sources {
                annotations: &none,
                env: &env
            },
            true
        ));
        assert!(!wants_share(
            &Sources {
                annotations: &none,
                env: &env
            },
            false
        ));
        assert!(!wants_share(
            &Sources {
                annotations: &none,
                env: &[]
            },
            true
        ));
    }
}
