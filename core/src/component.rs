//! Components, pure: how a deploy treats the instances folded by the
//! version it replaces ([`DeployMode`]), and the one rule that turns a
//! deploy's options (HTTP query, CLI flags) into a mode.

/// How a deploy treats the processor instances of the version it replaces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeployMode {
    /// Each instance goes on from its checkpoint with the new version.
    #[default]
    Continue,
    /// Every instance folds its stream again, from the new version's
    /// initial state (the old state serves reads until the new one has
    /// caught up).
    Refold {
        /// Store the effects the new version returns for the events the
        /// old version already folded (by default they are dropped: they
        /// ran under the old version).
        replay_effects: bool,
    },
    /// The new version folds beside the current one, which keeps serving
    /// and waking; its effects are held until it is promoted.
    Shadow,
}

impl DeployMode {
    /// The mode of a deploy's options: `refold` (`true`, `false` or
    /// `shadow`; absent is `false`) and `replay_effects`. A conflict is an
    /// error naming it: `replayEffects` needs a refold, and a shadow holds
    /// its effects.
    pub fn from_options(refold: Option<&str>, replay_effects: bool) -> Result<DeployMode, String> {
        let mode = match refold {
            None | Some("false") => DeployMode::Continue,
            Some("true") => DeployMode::Refold { replay_effects },
            Some("shadow") => DeployMode::Shadow,
            Some(other) => {
                return Err(format!(
                    "refold is {other:?}; expected true, false or shadow"
                ))
            }
        };
        match mode {
            DeployMode::Shadow if replay_effects => Err(
                "replayEffects=true does not go with refold=shadow: a shadow holds its effects \
                 (promote with runHeldEffects to run them)"
                    .into(),
            ),
            DeployMode::Continue if replay_effects => Err(
                "replayEffects=true needs refold=true: only a refold folds history again".into(),
            ),
            mode => Ok(mode),
        }
    }

    /// Whether every instance folds again from the start.
    pub fn refolds(self) -> bool {
        matches!(self, DeployMode::Refold { .. })
    }

    /// Whether a refold stores history's effects.
    pub fn replays_effects(self) -> bool {
        matches!(
            self,
            DeployMode::Refold {
                replay_effects: true
            }
        )
    }

    /// Whether the new version folds beside the current one.
    pub fn is_shadow(self) -> bool {
        self == DeployMode::Shadow
    }

    /// The HTTP query that asks for this mode (`refold=...`).
    pub fn query(self) -> &'static str {
        match self {
            DeployMode::Continue => "",
            DeployMode::Refold {
                replay_effects: false,
            } => "refold=true",
            DeployMode::Refold {
                replay_effects: true,
            } => "refold=true&replayEffects=true",
            DeployMode::Shadow => "refold=shadow",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_pair_is_a_mode_or_an_error_naming_the_conflict() {
        use DeployMode as M;
        let ok = |r: Option<&str>, e| DeployMode::from_options(r, e).unwrap();
        assert_eq!(ok(None, false), M::Continue);
        assert_eq!(ok(Some("false"), false), M::Continue);
        assert_eq!(
            ok(Some("true"), false),
            M::Refold {
                replay_effects: false
            }
        );
        assert_eq!(
            ok(Some("true"), true),
            M::Refold {
                replay_effects: true
            }
        );
        assert_eq!(ok(Some("shadow"), false), M::Shadow);
        let err = |r: Option<&str>, e| DeployMode::from_options(r, e).unwrap_err();
        assert!(err(None, true).contains("needs refold=true"));
        assert!(err(Some("false"), true).contains("needs refold=true"));
        assert!(err(Some("shadow"), true).contains("does not go with refold=shadow"));
        assert!(err(Some("yes"), false).contains("\"yes\""));
    }

    #[test]
    fn a_modes_query_reads_back_as_the_mode() {
        for mode in [
            DeployMode::Continue,
            DeployMode::Refold {
                replay_effects: false,
            },
            DeployMode::Refold {
                replay_effects: true,
            },
            DeployMode::Shadow,
        ] {
            let mut refold = None;
            let mut replay = false;
            for pair in mode.query().split('&').filter(|p| !p.is_empty()) {
                match pair.split_once('=').unwrap() {
                    ("refold", v) => refold = Some(v),
                    ("replayEffects", v) => replay = v == "true",
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(DeployMode::from_options(refold, replay).unwrap(), mode);
        }
    }
}
