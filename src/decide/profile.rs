//! Named requests ("profiles"): the built-in `mps`, `timeslice` and `limit`, and the policy's
//! `[profiles.<name>]`. The CDI device `gpushare.io/share=<name>` runs the hook with
//! `--profile <name>`; the profile's keys then stand among the container's annotations, and the
//! request is checked like any other (`request::parse`).
//!
//! Pure: the policy and the container's annotations in, annotations or a refusal out.

use std::collections::HashMap;

use thiserror::Error;

use crate::config::{Config, BUILTIN_PROFILES};
use crate::decide::input::HookView;
use crate::decide::request::{self, Request, RequestError, Sources};

/// The hook's flag that names a profile (in the CDI spec's hook entries).
pub const FLAG: &str = "--profile";
/// The env entry each CDI device adds, naming its profile: a container given two of gpushare's
/// devices has two different values (CDI appends env edits) and is refused.
pub const ENV: &str = "GPUSHARE_PROFILE";

/// A named request: the annotation keys it sets and their values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    pub keys: Vec<(&'static str, String)>,
}

/// Why a profile cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ProfileError {
    #[error("the CDI device gpushare.io/share={name} names no profile of this node's policy (known: {known}); regenerate the CDI spec with `gpushare-hook cdi generate` after changing [profiles]")]
    Unknown { name: String, known: String },
    #[error("the container asks for {key}={asked:?} but its CDI device gpushare.io/share={profile} sets {key}={set:?}; drop the annotation or pick the device that matches it")]
    Conflict {
        profile: String,
        key: &'static str,
        asked: String,
        set: String,
    },
    #[error("the container was given several gpushare devices ({names}); a container takes one share: keep one gpushare.io/share device")]
    Several { names: String },
    #[error("profile {name} is not a request this node serves ({where_})")]
    Request {
        name: String,
        where_: &'static str,
        #[source]
        source: RequestError,
    },
}

/// Every profile name: the modes, then the policy's profiles in name order.
pub fn names(cfg: &Config) -> Vec<String> {
    BUILTIN_PROFILES
        .iter()
        .map(|s| (*s).to_owned())
        .chain(cfg.profiles.keys().cloned())
        .collect()
}

/// The profile called `name`.
///
/// # Errors
/// [`ProfileError::Unknown`] when neither a mode nor a policy profile has that name.
pub fn find(cfg: &Config, name: &str) -> Result<Profile, ProfileError> {
    if let Some(rest) = name.strip_prefix(INLINE_PREFIX) {
        return inline(rest, name);
    }
    if BUILTIN_PROFILES.contains(&name) {
        return Ok(Profile {
            name: name.to_owned(),
            keys: vec![(request::ANNOTATION, name.to_owned())],
        });
    }
    let p = cfg
        .profiles
        .get(name)
        .ok_or_else(|| ProfileError::Unknown {
            name: name.chars().take(64).collect(),
            known: names(cfg).join(", "),
        })?;
    let [_, _, memory, cores, timeslice, group] = request::annotation_keys();
    let mut keys = vec![(request::ANNOTATION, p.mode.as_str().to_owned())];
    let optional = [
        (cores, p.cores.map(|c| c.to_string())),
        (memory, p.memory.clone()),
        (group, p.group.clone()),
        (timeslice, p.timeslice.clone()),
    ];
    keys.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
    Ok(Profile {
        name: name.to_owned(),
        keys,
    })
}

/// An inline profile starts so: the request itself, `gpu.share=<mode>[,gpu.share.<key>=<value>…]`
/// (a per-claim CDI spec of the DRA plugin puts it in the hook's argv).
pub const INLINE_PREFIX: &str = "gpu.share=";

fn inline(rest: &str, name: &str) -> Result<Profile, ProfileError> {
    let mut parts = rest.split(',');
    let mut keys = vec![(
        request::ANNOTATION,
        parts.next().unwrap_or_default().to_owned(),
    )];
    for part in parts {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        let Some(key) = request::annotation_keys().into_iter().find(|a| *a == k) else {
            return Err(ProfileError::Request {
                name: name.chars().take(64).collect(),
                where_: "an inline request",
                source: RequestError::UnknownKey(k.chars().take(64).collect()),
            });
        };
        keys.push((key, v.to_owned()));
    }
    Ok(Profile {
        name: name.to_owned(),
        keys,
    })
}

impl Profile {
    /// Puts the profile's keys among `annotations`. A key the container set itself must say
    /// the same (a mode by any of its names).
    ///
    /// # Errors
    /// [`ProfileError::Conflict`] naming the key and both values.
    pub fn apply(&self, annotations: &mut HashMap<String, String>) -> Result<(), ProfileError> {
        for (key, value) in &self.keys {
            match annotations.get(*key) {
                Some(asked) if !same_value(key, asked, value) => {
                    return Err(ProfileError::Conflict {
                        profile: self.name.clone(),
                        key,
                        asked: asked.chars().take(64).collect(),
                        set: value.clone(),
                    })
                }
                Some(_) => {}
                None => {
                    annotations.insert((*key).to_owned(), value.clone());
                }
            }
        }
        Ok(())
    }

    /// Checks the profile against the policy like an annotation request.
    ///
    /// # Errors
    /// [`ProfileError::Request`] with the request's own refusal.
    pub fn check(&self, cfg: &Config) -> Result<Request, ProfileError> {
        let annotations: HashMap<String, String> = self
            .keys
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        let src = Sources {
            annotations: &annotations,
            env: &[],
        };
        let wrap = |source| ProfileError::Request {
            name: self.name.clone(),
            where_: if self.name.starts_with(INLINE_PREFIX) {
                "an inline request"
            } else if BUILTIN_PROFILES.contains(&self.name.as_str()) {
                "[policy] modes"
            } else {
                "[profiles] of the policy"
            },
            source,
        };
        match request::parse(&src, cfg) {
            Ok(Some(r)) => Ok(r),
            Ok(None) => unreachable!("a profile always names a mode"),
            Err(e) => Err(wrap(e)),
        }
    }
}

fn same_value(key: &str, a: &str, b: &str) -> bool {
    a == b || (key == request::ANNOTATION && request::parse_mode(a) == request::parse_mode(b))
}

/// The profiles a container was given through gpushare's CDI devices: the `--profile` of every
/// gpushare createRuntime hook entry, and every `GPUSHARE_PROFILE` env entry.
///
/// # Errors
/// [`ProfileError::Several`] when they name more than one profile.
pub fn given(hooks: &[HookView], env: &[String], own: &str) -> Result<(), ProfileError> {
    let mut seen = vec![own.to_owned()];
    let from_hooks = hooks
        .iter()
        .filter(|h| std::path::Path::new(&h.path).file_name() == Some("gpushare-hook".as_ref()))
        .filter_map(|h| {
            h.args
                .iter()
                .position(|a| a == FLAG)
                .and_then(|i| h.args.get(i + 1))
        });
    let prefix = format!("{ENV}=");
    let from_env = env.iter().filter_map(|e| e.strip_prefix(prefix.as_str()));
    for n in from_hooks.map(String::as_str).chain(from_env) {
        if !seen.iter().any(|s| s == n) {
            seen.push(n.chars().take(64).collect());
        }
    }
    if seen.len() > 1 {
        return Err(ProfileError::Several {
            names: seen.join(", "),
        });
    }
    Ok(())
}

/// The profile the container's gpushare CDI device names, for an entry point that runs without
/// `--profile` (the spec edit of precreate and `gpushare-runtime`, which sees the spec with the
/// device's edits applied): the `--profile` of a gpushare createRuntime hook entry, or the
/// `GPUSHARE_PROFILE` env entry.
///
/// # Errors
/// [`ProfileError::Several`] when they name more than one profile.
pub fn named(hooks: &[HookView], env: &[String]) -> Result<Option<String>, ProfileError> {
    let from_hooks = hooks
        .iter()
        .filter(|h| std::path::Path::new(&h.path).file_name() == Some("gpushare-hook".as_ref()))
        .filter_map(|h| {
            h.args
                .iter()
                .position(|a| a == FLAG)
                .and_then(|i| h.args.get(i + 1))
        })
        .map(String::as_str);
    let prefix = format!("{ENV}=");
    let from_env = env.iter().filter_map(|e| e.strip_prefix(prefix.as_str()));
    let Some(first) = from_hooks.chain(from_env).next() else {
        return Ok(None);
    };
    let first: String = first.chars().take(64).collect();
    given(hooks, env, &first)?;
    Ok(Some(first))
}

/// Every profile of the policy, checked (for `cdi generate`, `status` and `doctor`).
pub fn check_all(cfg: &Config) -> Vec<(String, Result<Request, ProfileError>)> {
    names(cfg)
        .into_iter()
        .map(|n| {
            let checked = find(cfg, &n).and_then(|p| p.check(cfg));
            (n, checked)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::Mode;

    type Keys<'a> = Vec<(&'a str, &'a str)>;

    fn policy(text: &str) -> Config {
        Config::parse(text, std::path::Path::new("t.toml")).unwrap()
    }

    #[test]
    fn builtins_and_policy_profiles_become_annotations() {
        let cfg = policy("[profiles.small]\nmode = \"mps\"\ncores = 25\nmemory = \"10Gi\"\n");
        assert_eq!(names(&cfg), ["mps", "timeslice", "limit", "small"]);
        let rows: [(&str, &str, Keys); 2] = [
            ("a mode", "limit", vec![("gpu.share", "limit")]),
            (
                "a policy profile",
                "small",
                vec![
                    ("gpu.share", "mps"),
                    ("gpu.share.cores", "25"),
                    ("gpu.share.memory", "10Gi"),
                ],
            ),
        ];
        for (what, name, want) in rows {
            let p = find(&cfg, name).unwrap();
            let got: Vec<(&str, &str)> = p.keys.iter().map(|(k, v)| (*k, v.as_str())).collect();
            assert_eq!(got, want, "{what}");
        }
        let e = find(&cfg, "big").unwrap_err();
        assert!(
            e.to_string()
                .contains("known: mps, timeslice, limit, small"),
            "{e}"
        );
    }

    #[test]
    fn a_profile_fills_in_and_conflicts_are_refused() {
        let cfg = policy("[profiles.small]\nmode = \"mps\"\ncores = 25\n");
        let p = find(&cfg, "small").unwrap();
        let rows: [(&str, Keys, Option<&str>); 4] = [
            ("nothing of its own", vec![], None),
            (
                "the same values, the mode by an alias",
                vec![("gpu.share", "mps"), ("gpu.share.cores", "25")],
                None,
            ),
            (
                "a key the profile leaves open",
                vec![("gpu.share.memory", "1Gi")],
                None,
            ),
            (
                "another mode",
                vec![("gpu.share", "preload")],
                Some("gpu.share=\"preload\" but its CDI device gpushare.io/share=small sets gpu.share=\"mps\""),
            ),
        ];
        for (what, own, refusal) in rows {
            let mut a: HashMap<String, String> = own
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let before = a.clone();
            match (p.apply(&mut a), refusal) {
                (Ok(()), None) => {
                    assert_eq!(a["gpu.share"], "mps", "{what}");
                    assert_eq!(a["gpu.share.cores"], "25", "{what}");
                    for (k, v) in &before {
                        assert_eq!(&a[k], v, "{what}: the container's own key kept");
                    }
                }
                (Err(e), Some(line)) => assert!(e.to_string().contains(line), "{what}: {e}"),
                (got, want) => panic!("{what}: got {got:?}, wanted refusal {want:?}"),
            }
        }
        let mut a = HashMap::from([("gpu.share.cores".to_owned(), "50".to_owned())]);
        assert!(matches!(
            p.apply(&mut a),
            Err(ProfileError::Conflict {
                key: "gpu.share.cores",
                ..
            })
        ));
    }

    #[test]
    fn profiles_are_checked_like_annotation_requests() {
        let cfg = policy(
            "[policy]\nmodes = [\"mps\", \"timeslice\"]\nmax_memory = \"8Gi\"\n\
             [profiles.small]\nmode = \"mps\"\nmemory = \"4Gi\"\n\
             [profiles.huge]\nmode = \"mps\"\nmemory = \"16Gi\"\n\
             [profiles.sliced]\nmode = \"timeslice\"\ncores = 10\n",
        );
        let checked: HashMap<String, Result<Request, ProfileError>> =
            check_all(&cfg).into_iter().collect();
        let small = checked["small"].as_ref().unwrap();
        assert_eq!((small.mode, small.memory), (Mode::Mps, Some(4 << 30)));
        assert!(checked["mps"].is_ok() && checked["timeslice"].is_ok());
        let refused = |n: &str| checked[n].as_ref().unwrap_err().to_string();
        assert!(
            refused("limit").contains("[policy] modes"),
            "{}",
            refused("limit")
        );
        for n in ["huge", "sliced"] {
            assert!(
                refused(n).contains("[profiles] of the policy"),
                "{}",
                refused(n)
            );
        }
        let chain = crate::vocab::chain(checked["huge"].as_ref().unwrap_err());
        assert!(chain.contains("above"), "{chain}");
    }

    #[test]
    fn an_inline_profile_is_the_request_itself() {
        let cfg = policy("[policy]\nmax_memory = \"8Gi\"\n");
        let p = find(
            &cfg,
            "gpu.share=mps,gpu.share.memory=4Gi,gpu.share.cores=25",
        )
        .unwrap();
        let got: Vec<(&str, &str)> = p.keys.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            got,
            [
                ("gpu.share", "mps"),
                ("gpu.share.memory", "4Gi"),
                ("gpu.share.cores", "25")
            ]
        );
        let r = p.check(&cfg).unwrap();
        assert_eq!((r.mode, r.memory, r.cores), (Mode::Mps, Some(4 << 30), 25));
        let e = find(&cfg, "gpu.share=mps,gpu.share.memory=16Gi")
            .unwrap()
            .check(&cfg)
            .unwrap_err();
        assert!(crate::vocab::chain(&e).contains("above"), "{e}");
        let e = find(&cfg, "gpu.share=mps,gpu.share.colour=red").unwrap_err();
        assert!(
            crate::vocab::chain(&e).contains("unknown annotation \"gpu.share.colour\""),
            "{e}"
        );
    }

    #[test]
    fn two_gpushare_devices_are_refused() {
        let hook = |args: &[&str]| HookView {
            path: "/usr/bin/gpushare-hook".into(),
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            env: vec![],
        };
        let one = [hook(&["gpushare-hook", "createRuntime", FLAG, "mps"])];
        assert_eq!(given(&one, &["GPUSHARE_PROFILE=mps".into()], "mps"), Ok(()));
        let two = [
            hook(&["gpushare-hook", "createRuntime", FLAG, "mps"]),
            hook(&["gpushare-hook", "createRuntime", FLAG, "limit"]),
        ];
        let e = given(&two, &[], "mps").unwrap_err();
        assert!(e.to_string().contains("mps, limit"), "{e}");
        let e = given(&one, &["GPUSHARE_PROFILE=timeslice".into()], "mps").unwrap_err();
        assert!(e.to_string().contains("mps, timeslice"), "{e}");
    }

    #[test]
    fn the_spec_edit_finds_the_devices_profile() {
        let hook = |args: &[&str]| HookView {
            path: "/usr/bin/gpushare-hook".into(),
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            env: vec![],
        };
        let cdi = [hook(&["gpushare-hook", "createRuntime", FLAG, "small"])];
        let env = ["GPUSHARE_PROFILE=small".to_owned()];
        assert_eq!(named(&cdi, &env), Ok(Some("small".into())));
        assert_eq!(named(&[], &env), Ok(Some("small".into())));
        assert_eq!(
            named(&[hook(&["gpushare-hook", "createRuntime"])], &[]),
            Ok(None)
        );
        let e = named(&cdi, &["GPUSHARE_PROFILE=mps".to_owned()]).unwrap_err();
        assert!(e.to_string().contains("small, mps"), "{e}");
    }
}
