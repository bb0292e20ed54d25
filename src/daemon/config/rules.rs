//! How one declared setting resolves ([`Rule`]): its bounds and its default, written as an
//! argument of its declaration (`int(1..=255).or(1)`), applied to the value as given and
//! naming its flag or key in errors.

use std::ops::RangeInclusive;
use std::time::Duration;

use crate::setting::{
    duration_at_least, format_duration, int_in, origin_of, parse, parse_list, ConfigError, Given,
    Setting,
};

/// How a field of [`Settings`](super::Settings) (`F`) resolves into its [`Config`](super::Config)
/// value.
pub(super) trait Rule<F> {
    /// The resolved value.
    type Out;
    /// Resolves the field `key` as given.
    ///
    /// # Errors
    /// A one-line [`ConfigError`] naming the flag or key.
    fn resolve(self, key: &'static str, field: &F) -> Result<Self::Out, ConfigError>;
}

/// Combinators of every rule.
pub(super) trait RuleExt: Sized {
    /// `default` where the rule gives `None` (the setting was not given).
    fn or<T>(self, default: T) -> Or<Self, T> {
        Or(self, default)
    }
}

impl<R> RuleExt for R {}

/// A rule with a default: see [`RuleExt::or`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Or<R, T>(R, T);

impl<F, T, R: Rule<F, Out = Option<T>>> Rule<F> for Or<R, T> {
    type Out = T;
    fn resolve(self, key: &'static str, field: &F) -> Result<T, ConfigError> {
        Ok(self.0.resolve(key, field)?.unwrap_or(self.1))
    }
}

/// An integer in a range, as `T`; `None` when not given.
#[derive(Debug, Clone, Copy)]
pub(super) struct Int<T> {
    lo: i64,
    hi: i64,
    out: std::marker::PhantomData<T>,
}

/// An integer in `range`, of the range's type.
pub(super) fn int<T: Copy + TryInto<i64>>(range: RangeInclusive<T>) -> Int<T> {
    let bound = |v: T| v.try_into().unwrap_or(i64::MAX);
    Int {
        lo: bound(*range.start()),
        hi: bound(*range.end()),
        out: std::marker::PhantomData,
    }
}

impl<T: TryFrom<i64>> Rule<Option<Given<i64>>> for Int<T> {
    type Out = Option<T>;
    fn resolve(
        self,
        key: &'static str,
        given: &Option<Given<i64>>,
    ) -> Result<Option<T>, ConfigError> {
        int_in(key, given.as_ref(), self.lo, self.hi)?
            .map(|v| {
                T::try_from(v).map_err(|_| {
                    origin_of(given.as_ref()).err(
                        key,
                        format!("must be between {} and {} (got {v})", self.lo, self.hi),
                    )
                })
            })
            .transpose()
    }
}

/// A duration of at least `min` and at most `max`; `None` when not given.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    min: Duration,
    max: Option<Duration>,
}

/// A duration of at least `min` (`1ms`: "must be positive").
pub(super) fn duration(min: Duration) -> Span {
    Span { min, max: None }
}

impl Span {
    /// And at most `max`.
    pub(super) fn at_most(self, max: Duration) -> Self {
        Self {
            max: Some(max),
            ..self
        }
    }
}

impl Rule<Option<Given<Duration>>> for Span {
    type Out = Option<Duration>;
    fn resolve(
        self,
        key: &'static str,
        given: &Option<Given<Duration>>,
    ) -> Result<Option<Duration>, ConfigError> {
        if given.is_none() {
            return Ok(None);
        }
        let d = duration_at_least(key, given.as_ref(), self.min, Duration::ZERO)?;
        if let Some(max) = self.max.filter(|max| d > *max) {
            return Err(origin_of(given.as_ref())
                .err(key, format!("must be at most {}", format_duration(max))));
        }
        Ok(Some(d))
    }
}

/// Any value of the setting's type; `None` when not given.
#[derive(Debug, Clone, Copy)]
pub(super) struct Value;

/// Any value of the setting's type.
pub(super) fn value() -> Value {
    Value
}

impl<T: Setting> Rule<Option<Given<T>>> for Value {
    type Out = Option<T>;
    fn resolve(
        self,
        key: &'static str,
        given: &Option<Given<T>>,
    ) -> Result<Option<T>, ConfigError> {
        parse(key, given.as_ref())
    }
}

/// A switch: whether it is on (`false` when not given).
#[derive(Debug, Clone, Copy)]
pub(super) struct Switch {
    off: bool,
}

/// Whether the switch is on.
pub(super) fn switch() -> Switch {
    Switch { off: false }
}

impl Switch {
    /// Whether it is off instead (a `no_*` switch of something on by default).
    pub(super) fn off(self) -> Self {
        Self { off: !self.off }
    }
}

impl Rule<Option<Given<bool>>> for Switch {
    type Out = bool;
    fn resolve(self, key: &'static str, given: &Option<Given<bool>>) -> Result<bool, ConfigError> {
        Ok((parse(key, given.as_ref())? == Some(true)) != self.off)
    }
}

/// Every value of a repeatable setting, at most `max`.
#[derive(Debug, Clone, Copy)]
pub(super) struct List {
    max: Option<(usize, &'static str)>,
}

/// Every value of a repeatable setting.
pub(super) fn list() -> List {
    List { max: None }
}

impl List {
    /// At most `max` of them, each one `what` ("more than 4096 static neighbours").
    pub(super) fn at_most(self, max: usize, what: &'static str) -> Self {
        Self {
            max: Some((max, what)),
        }
    }
}

impl<T: Setting> Rule<Vec<Given<T>>> for List {
    type Out = Vec<T>;
    fn resolve(self, key: &'static str, given: &Vec<Given<T>>) -> Result<Vec<T>, ConfigError> {
        let values = parse_list(key, given)?;
        if let Some((max, what)) = self.max {
            if let Some(over) = given.get(max) {
                return Err(over.origin().err(key, format!("more than {max} {what}")));
            }
        }
        Ok(values)
    }
}

/// A value worked out apart from the rules above (from more than its own field): the result
/// is the resolved value.
#[derive(Debug)]
pub(super) struct Computed<T>(pub Result<T, ConfigError>);

impl<F, T> Rule<F> for Computed<T> {
    type Out = T;
    fn resolve(self, _key: &'static str, _field: &F) -> Result<T, ConfigError> {
        self.0
    }
}
