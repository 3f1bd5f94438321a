//! The Kubernetes names of a container (namespace, pod, container), from the annotations the
//! CRI engines put into its spec, for metrics and events; and its namespace as the CRI set it,
//! which a group domain belongs to ([`namespace`]). Pure.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Where each name is read from, first found wins: the kubelet's own labels (which CRI-O also
/// copies into the spec), containerd's CRI annotations, then CRI-O's. The namespace is read by
/// [`namespace`] instead.
///
/// Every key a container's namespace may be read from. containerd's CRI sets
/// `io.kubernetes.cri.sandbox-namespace` after the pod annotations it passes through, and CRI-O
/// copies the kubelet's label `io.kubernetes.pod.namespace` (and its own
/// `io.kubernetes.cri-o.Namespace`, and the labels as JSON) after the pod's annotations: so on a
/// CRI engine the engine's own key always holds the pod's real namespace, and a pod annotation
/// can only add a key of the other engine.
const NAMESPACE: &[&str] = &[
    "io.kubernetes.pod.namespace",
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.cri-o.Namespace",
];
const POD: &[&str] = &[
    "io.kubernetes.pod.name",
    "io.kubernetes.cri.sandbox-name",
    "io.kubernetes.cri-o.KubeName",
];
const CONTAINER: &[&str] = &[
    "io.kubernetes.container.name",
    "io.kubernetes.cri.container-name",
];
/// CRI-O's JSON object of the container's CRI labels (holds `io.kubernetes.container.name`).
const CRIO_LABELS: &str = "io.kubernetes.cri-o.Labels";
/// Longest name kept (a Kubernetes name is at most 253 bytes).
const MAX_NAME: usize = 253;

/// A container's Kubernetes names, each present only when the engine gave a well-formed one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeLabels {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

impl KubeLabels {
    /// Reads the names from a spec's annotations. A value that is not a plausible Kubernetes
    /// name (empty, too long, characters outside `[A-Za-z0-9._-]`) is left out: these are
    /// labels only, never a reason to refuse a container.
    pub fn from_annotations(annotations: &HashMap<String, String>) -> Self {
        let pick = |keys: &[&str]| {
            keys.iter()
                .filter_map(|k| annotations.get(*k))
                .find_map(|v| well_formed(v))
        };
        let crio_container = || {
            let labels: HashMap<String, String> =
                serde_json::from_str(annotations.get(CRIO_LABELS)?).ok()?;
            well_formed(labels.get("io.kubernetes.container.name")?)
        };
        KubeLabels {
            namespace: namespace(annotations).ok().flatten(),
            pod: pick(POD),
            container: pick(CONTAINER).or_else(crio_container),
        }
    }

    /// Whether no name is known (a container not started by a CRI engine).
    pub fn is_empty(&self) -> bool {
        self.namespace.is_none() && self.pod.is_none() && self.container.is_none()
    }
}

/// The namespace keys of a spec disagree, or one is not a namespace: a pod annotation tried
/// to pass for the engine's own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the spec names more than one Kubernetes namespace ({found}); a pod annotation may not set io.kubernetes.* namespace keys: remove it")]
pub struct NamespaceConflict {
    /// `key=value` of every namespace key found.
    pub found: String,
}

/// The container's Kubernetes namespace as its CRI engine set it: every namespace key present
/// (see [`NAMESPACE`], and `io.kubernetes.pod.namespace` in CRI-O's labels) must name the same
/// well-formed namespace, since the engine's own key always holds the real one and a pod
/// annotation can only add another. `None` when there is none (not a CRI container: on
/// podman, Docker, ctr or runc whoever runs the container writes every annotation).
///
/// # Errors
/// [`NamespaceConflict`] when the keys disagree or one is not a namespace name.
pub fn namespace(
    annotations: &HashMap<String, String>,
) -> Result<Option<String>, NamespaceConflict> {
    let mut found: Vec<(String, String)> = NAMESPACE
        .iter()
        .filter_map(|k| Some(((*k).to_owned(), annotations.get(*k)?.clone())))
        .collect();
    if let Some(labels) = annotations.get(CRIO_LABELS) {
        let labels: HashMap<String, serde_json::Value> =
            serde_json::from_str(labels).unwrap_or_default();
        if let Some(v) = labels.get("io.kubernetes.pod.namespace") {
            found.push((
                format!("{CRIO_LABELS}[io.kubernetes.pod.namespace]"),
                v.as_str().map_or_else(|| v.to_string(), str::to_owned),
            ));
        }
    }
    let Some((_, first)) = found.first() else {
        return Ok(None);
    };
    if found.iter().all(|(_, v)| v == first) && crate::vocab::names::is_namespace(first) {
        return Ok(Some(first.clone()));
    }
    Err(NamespaceConflict {
        found: found
            .iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect::<Vec<_>>()
            .join(", "),
    })
}

fn well_formed(v: &str) -> Option<String> {
    let ok = !v.is_empty()
        && v.len() <= MAX_NAME
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    ok.then(|| v.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn kubelet_labels_are_read() {
        let l = KubeLabels::from_annotations(&ann(&[
            ("io.kubernetes.pod.namespace", "ml"),
            ("io.kubernetes.pod.name", "train-0"),
            ("io.kubernetes.container.name", "worker"),
        ]));
        assert_eq!(l.namespace.as_deref(), Some("ml"));
        assert_eq!(l.pod.as_deref(), Some("train-0"));
        assert_eq!(l.container.as_deref(), Some("worker"));
    }

    #[test]
    fn containerd_cri_annotations_are_read() {
        // As containerd's CRI plugin writes them into a container's spec.
        let l = KubeLabels::from_annotations(&ann(&[
            ("io.kubernetes.cri.container-type", "container"),
            ("io.kubernetes.cri.sandbox-namespace", "default"),
            ("io.kubernetes.cri.sandbox-name", "web-7d9f"),
            ("io.kubernetes.cri.container-name", "app"),
        ]));
        assert_eq!(
            (
                l.namespace.as_deref(),
                l.pod.as_deref(),
                l.container.as_deref()
            ),
            (Some("default"), Some("web-7d9f"), Some("app"))
        );
    }

    #[test]
    fn crio_annotations_are_read() {
        // As CRI-O writes them (its container name annotation is the long k8s_… form, so the
        // container's own name comes from its labels).
        let l = KubeLabels::from_annotations(&ann(&[
            ("io.kubernetes.cri-o.Namespace", "default"),
            ("io.kubernetes.cri-o.KubeName", "segfaulter"),
            (
                "io.kubernetes.cri-o.ContainerName",
                "k8s_main_segfaulter_default_aaaa_0",
            ),
            (
                "io.kubernetes.cri-o.Labels",
                r#"{"io.kubernetes.container.name":"main","io.kubernetes.pod.namespace":"default"}"#,
            ),
        ]));
        assert_eq!(
            (
                l.namespace.as_deref(),
                l.pod.as_deref(),
                l.container.as_deref()
            ),
            (Some("default"), Some("segfaulter"), Some("main"))
        );
    }

    #[test]
    fn the_namespace_is_the_engines_own() {
        type Row<'a> = (
            &'a str,
            &'a [(&'a str, &'a str)],
            Result<Option<&'a str>, ()>,
        );
        let rows: &[Row] = &[
            ("not a CRI container", &[("gpu.share", "mps")], Ok(None)),
            (
                "containerd",
                &[
                    ("io.kubernetes.cri.container-type", "container"),
                    ("io.kubernetes.cri.sandbox-namespace", "team-a"),
                ],
                Ok(Some("team-a")),
            ),
            (
                "CRI-O",
                &[
                    ("io.kubernetes.pod.namespace", "team-a"),
                    ("io.kubernetes.cri-o.Namespace", "team-a"),
                    (
                        "io.kubernetes.cri-o.Labels",
                        r#"{"io.kubernetes.pod.namespace":"team-a"}"#,
                    ),
                ],
                Ok(Some("team-a")),
            ),
            (
                "a pod annotation of containerd's key on CRI-O",
                &[
                    ("io.kubernetes.pod.namespace", "evil"),
                    ("io.kubernetes.cri.sandbox-namespace", "team-a"),
                ],
                Err(()),
            ),
            (
                "a passed-through pod annotation of CRI-O's key on containerd",
                &[
                    ("io.kubernetes.pod.namespace", "team-a"),
                    ("io.kubernetes.cri.sandbox-namespace", "evil"),
                ],
                Err(()),
            ),
            (
                "CRI-O's labels disagree",
                &[
                    ("io.kubernetes.pod.namespace", "team-a"),
                    (
                        "io.kubernetes.cri-o.Labels",
                        r#"{"io.kubernetes.pod.namespace":"evil"}"#,
                    ),
                ],
                Err(()),
            ),
            (
                "not a namespace name",
                &[("io.kubernetes.cri.sandbox-namespace", "Team_A")],
                Err(()),
            ),
        ];
        for (what, pairs, want) in rows {
            let got = namespace(&ann(pairs));
            assert_eq!(
                got.as_ref().map(|o| o.as_deref()).map_err(|_| ()),
                want.clone(),
                "{what}: {got:?}"
            );
        }
    }

    #[test]
    fn malformed_names_are_left_out() {
        let long = "a".repeat(254);
        let l = KubeLabels::from_annotations(&ann(&[
            ("io.kubernetes.pod.namespace", "bad name\n"),
            ("io.kubernetes.pod.name", &long),
            ("io.kubernetes.container.name", ""),
            ("io.kubernetes.cri-o.Labels", "{not json"),
        ]));
        assert!(l.is_empty(), "{l:?}");
        assert!(KubeLabels::from_annotations(&HashMap::new()).is_empty());
    }

    #[test]
    fn names_keep_dots_underscores_and_dashes_and_one_name_is_not_empty() {
        for (key, name) in [
            ("io.kubernetes.pod.name", "web-0.v1_a"),
            ("io.kubernetes.container.name", "side_car.x-1"),
            ("io.kubernetes.pod.namespace", "team-a"),
        ] {
            let l = KubeLabels::from_annotations(&ann(&[(key, name)]));
            assert!(!l.is_empty(), "{key}: {l:?}");
            let got = [&l.namespace, &l.pod, &l.container]
                .into_iter()
                .flatten()
                .cloned()
                .collect::<Vec<_>>();
            assert_eq!(got, vec![name.to_owned()], "{key}");
        }
        for bad in ["a/b", "a b", "a:b", "ä"] {
            let l = KubeLabels::from_annotations(&ann(&[("io.kubernetes.pod.name", bad)]));
            assert!(l.is_empty(), "{bad:?}: {l:?}");
        }
    }
}
