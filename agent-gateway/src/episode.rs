//! Episodes the gateway is running: task and the actions taken so far.

use std::collections::HashMap;
use std::sync::Mutex;

/// What the gateway remembers of one episode between steps.
#[derive(Clone, Debug, Default)]
pub struct EpisodeState {
    pub task: String,
    /// Validated actions as compact JSON, oldest first.
    pub history: Vec<String>,
    /// Steps run so far (including failed ones).
    pub steps: u32,
}

/// Episodes by id with the clock tick of their last step, and the clock.
type Episodes = (HashMap<String, (u64, EpisodeState)>, u64);

/// Episodes by id. Bounded: the least recently started episodes are forgotten first.
pub struct EpisodeStore {
    inner: Mutex<Episodes>,
    capacity: usize,
}

impl EpisodeStore {
    pub fn new(capacity: usize) -> Self {
        Self { inner: Mutex::new((HashMap::new(), 0)), capacity: capacity.max(1) }
    }

    /// The episode's state, created with `task` if unknown. A non-empty `task` that differs
    /// from the stored one starts the episode afresh (a new task under a reused id).
    pub fn begin_step(&self, id: &str, task: &str) -> EpisodeState {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, clock) = &mut *g;
        *clock += 1;
        let now = *clock;
        if let Some((t, st)) = map.get_mut(id) {
            *t = now;
            if !task.is_empty() && st.task != task {
                *st = EpisodeState { task: task.to_string(), ..Default::default() };
            }
            return st.clone();
        }
        if map.len() >= self.capacity {
            if let Some(oldest) = map.iter().min_by_key(|(_, (t, _))| *t).map(|(k, _)| k.clone()) {
                map.remove(&oldest);
            }
        }
        let st = EpisodeState { task: task.to_string(), ..Default::default() };
        map.insert(id.to_string(), (now, st.clone()));
        st
    }

    /// Records the outcome of a step: `action` is the validated action JSON, if any.
    pub fn end_step(&self, id: &str, action: Option<String>) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, st)) = g.0.get_mut(id) {
            st.steps += 1;
            if let Some(a) = action {
                st.history.push(a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_accumulates_and_capacity_evicts_oldest() {
        let s = EpisodeStore::new(2);
        s.begin_step("a", "task a");
        s.end_step("a", Some("{\"action_type\":\"wait\"}".into()));
        let a = s.begin_step("a", "");
        assert_eq!(a.history.len(), 1);
        assert_eq!(a.steps, 1);
        s.begin_step("b", "task b");
        s.begin_step("c", "task c"); // evicts a (least recently used)
        assert!(s.begin_step("a", "task a").history.is_empty());
        // A new task under the same id restarts the episode.
        s.end_step("a", Some("x".into()));
        assert!(s.begin_step("a", "other task").history.is_empty());
    }
}
