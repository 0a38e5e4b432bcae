//! A view built from one watch's events that a relist rebuilds and swaps in whole, as a
//! reflector store does: until the relist is complete, the previous view serves.

use kube::runtime::watcher;

#[derive(Default)]
pub struct Relisted<T> {
    live: T,
    relist: Option<T>,
}

impl<T: Default> Relisted<T> {
    /// Applies one event: `apply` records an object as it now is, `delete` one that is gone.
    pub fn observe<K>(
        &mut self,
        event: &watcher::Event<K>,
        apply: impl FnOnce(&mut T, &K),
        delete: impl FnOnce(&mut T, &K),
    ) {
        match event {
            watcher::Event::Apply(obj) => apply(&mut self.live, obj),
            watcher::Event::Delete(obj) => delete(&mut self.live, obj),
            watcher::Event::Init => self.relist = Some(T::default()),
            watcher::Event::InitApply(obj) => {
                apply(self.relist.as_mut().unwrap_or(&mut self.live), obj);
            }
            watcher::Event::InitDone => {
                if let Some(relist) = self.relist.take() {
                    self.live = relist;
                }
            }
        }
    }

    pub fn live(&self) -> &T {
        &self.live
    }
}
