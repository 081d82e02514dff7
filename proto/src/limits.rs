//! The value rules of the contracts, checked with these functions by both servers, so a
//! field means the same on every hop: the gateway (gRPC `AgentService`, the OpenAI HTTP
//! endpoint) and the worker (gRPC `StepService`).
//!
//! - Seeded sampling ([`check_seeded`]): `temperature` in (0, 2], `top_p` in [0, 1] (0 or 1:
//!   off), `top_k` any (0 or at least the vocabulary: off), `seed` any. NaN and infinities
//!   are out of every range. `max_tokens` needs no rule: 0 is the worker's default and
//!   generation also stops when the context is full.

use crate::step::v1 as pb;

/// The largest sampling temperature (OpenAI's bound).
pub const MAX_TEMPERATURE: f32 = 2.0;

/// A field whose value is outside its rule: the field, the rule, and the value as shown
/// (cut to a prefix for long ones).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: &'static str,
    pub expected: &'static str,
    pub found: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: expected {}, found {}", self.field, self.expected, self.found)
    }
}

impl std::error::Error for FieldError {}

/// Checks seeded-sampling parameters (see the module rules).
///
/// Errors: [`FieldError`] naming the first field out of range (`temperature`, `top_p`).
pub fn check_seeded(s: &pb::Seeded) -> Result<(), FieldError> {
    if !(s.temperature > 0.0 && s.temperature <= MAX_TEMPERATURE) {
        return Err(FieldError { field: "temperature", expected: "a number in (0, 2] for seeded sampling", found: s.temperature.to_string() });
    }
    if !(0.0..=1.0).contains(&s.top_p) {
        return Err(FieldError { field: "top_p", expected: "a number in [0, 1] (0 or 1: off)", found: s.top_p.to_string() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_sampling_outside_its_ranges_names_the_field() {
        let ok = pb::Seeded { seed: 1, temperature: 0.7, top_p: 0.0, top_k: 0 };
        assert_eq!(check_seeded(&ok), Ok(()));
        assert_eq!(check_seeded(&pb::Seeded { temperature: 2.0, top_p: 1.0, top_k: u32::MAX, ..ok }), Ok(()));
        let cases = [
            (pb::Seeded { temperature: f32::NAN, ..ok }, "temperature"),
            (pb::Seeded { temperature: 0.0, ..ok }, "temperature"),
            (pb::Seeded { temperature: -1.0, ..ok }, "temperature"),
            (pb::Seeded { temperature: f32::INFINITY, ..ok }, "temperature"),
            (pb::Seeded { temperature: 2.5, ..ok }, "temperature"),
            (pb::Seeded { top_p: f32::NAN, ..ok }, "top_p"),
            (pb::Seeded { top_p: -0.1, ..ok }, "top_p"),
            (pb::Seeded { top_p: 1.5, ..ok }, "top_p"),
            (pb::Seeded { top_p: f32::INFINITY, ..ok }, "top_p"),
        ];
        for (s, field) in cases {
            assert_eq!(check_seeded(&s).unwrap_err().field, field, "{s:?}");
        }
    }
}
