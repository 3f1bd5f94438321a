//! The Kubernetes names of a container (namespace, pod, container), from the annotations the
//! CRI engines put into its spec, for metrics and events. Pure.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Where each name is read from, first found wins: the kubelet's own labels (which CRI-O also
/// copies into the spec), containerd's CRI annotations, then CRI-O's.
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
            namespace: pick(NAMESPACE),
            pod: pick(POD),
            container: pick(CONTAINER).or_else(crio_container),
        }
    }

    /// Whether no name is known (a container not started by a CRI engine).
    pub fn is_empty(&self) -> bool {
        self.namespace.is_none() && self.pod.is_none() && self.container.is_none()
    }
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
}
