use crate::Client;
use crate::client::Call;

use super::pages::Tree;

/// Curated knowledge of one context. Get one from [`Client::knowledge`].
#[derive(Debug, Clone, Copy)]
pub struct Knowledge<'c> {
    pub(crate) client: &'c Client,
    pub(crate) slug: &'c str,
}

impl<'c> Knowledge<'c> {
    /// `GET /contexts/{slug}/knowledge/read/{path}`: a curated file's bytes.
    ///
    /// # Errors
    /// Any [`Error`](crate::Error) of the call.
    pub fn read<'a>(&self, path: &'a str) -> Call<'a, bytes::Bytes>
    where
        'c: 'a,
    {
        super::sources::read_file(self.client, Tree::Knowledge, self.slug, path)
    }

    /// `GET /contexts/{slug}/knowledge/list[/{path}]`: every entry of a
    /// directory (the root unless [`ListFiles::path`](super::ListFiles::path)
    /// names one). `.await` it for every entry (bounded by
    /// [`ListFiles::max_items`](super::ListFiles::max_items)), read
    /// [`ListFiles::pages`](super::ListFiles::pages) page by page (the first
    /// page alone: `.page_size(n).pages()`, then one `try_next`), or
    /// [`ListFiles::items`](super::ListFiles::items) entry by entry.
    pub fn list(&self) -> super::ListFiles<'c> {
        super::ListFiles::new(self.client, Tree::Knowledge, self.slug)
    }
}
