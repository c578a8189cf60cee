//! Listings that span pages: every item at once, or a stream of pages.
//!
//! `list()` on [`Sessions`](super::Sessions), [`Tasks`](super::Tasks),
//! [`Sources`](super::Sources) and [`Knowledge`](super::Knowledge) returns a
//! builder, and each task has one way:
//!
//! - every item: `.await` the builder (at most `max_items` items);
//! - page by page: `.pages()`, a [`Stream`](futures::Stream) of [`Page`]s
//!   (each with the server's `total` when it sends one) of `page_size`
//!   items;
//! - item by item: `.items()`, a stream of items.
//!
//! Stop reading a stream when you have enough: no further page is fetched.
//!
//! The pages are checked as they come: a server that answers a different
//! page than the one asked for, points back to a page already read, or sends
//! a page holding only items already seen fails with
//! [`Error::Paging`](crate::Error::Paging) instead of looping. An item that
//! shows up again on a later page (the listing changed while it was read) is
//! delivered once. A listing stops with [`Error::Paging`] when it would
//! exceed its item bound ([`DEFAULT_MAX_ITEMS`] unless set with
//! `max_items`): it is never truncated silently.

use std::collections::HashSet;
use std::hash::Hash;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};

use crate::error::{Error, Result};

/// The most items a listing returns unless its builder's `max_items` says otherwise.
pub const DEFAULT_MAX_ITEMS: usize = 10_000;

/// Items asked for per request unless a builder's `page_size` says otherwise.
pub const DEFAULT_PAGE_SIZE: u64 = 100;

/// The two other ways to read a listing builder `$builder` whose `pages()`
/// yields `$item`s: `items()` (documented by the given doc comment) and
/// `.await` for every item.
macro_rules! items_and_await {
    ($builder:ident, $item:ty, $(#[$doc:meta])*) => {
        impl<'c> $builder<'c> {
            $(#[$doc])*
            pub fn items(self) -> $crate::resources::Items<'c, $item> {
                $crate::resources::pages::items(self.pages())
            }
        }

        impl<'c> std::future::IntoFuture for $builder<'c> {
            type Output = $crate::Result<Vec<$item>>;
            type IntoFuture = futures::future::BoxFuture<'c, Self::Output>;

            fn into_future(self) -> Self::IntoFuture {
                Box::pin($crate::resources::pages::collect(self.pages()))
            }
        }
    };
}
pub(crate) use items_and_await;

/// The bounds of a paged listing builder: `page_size` (1 to 1000, default
/// 100) and `max_items` (default [`DEFAULT_MAX_ITEMS`]), naming its items
/// `$What` (or `$what`) in their docs.
macro_rules! paging_bounds {
    ($What:literal, $what:literal) => {
        #[doc = concat!(
            $What,
            " asked for per request, 1 to 1000 (default 100)."
        )]
        pub fn page_size(mut self, n: u64) -> Self {
            self.page_size = n;
            self
        }

        #[doc = concat!(
            "The most ",
            $what,
            " the listing may hold (default [`DEFAULT_MAX_ITEMS`](crate::resources::DEFAULT_MAX_ITEMS)); more is an [`Error::Paging`](crate::Error::Paging)."
        )]
        pub fn max_items(mut self, n: usize) -> Self {
            self.max_items = n;
            self
        }
    };
}
pub(crate) use paging_bounds;

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Page<T> {
    /// The page's items in the server's order, without items an earlier page
    /// already delivered.
    pub items: Vec<T>,
    /// Where the page starts in the listing, as the server counts (0-based).
    pub offset: u64,
    /// How many items the server says the listing holds, when it says.
    pub total: Option<u64>,
    /// Whether another page follows.
    pub has_more: bool,
}

/// A stream of pages. Dropping it stops the listing.
pub type Pages<'a, T> = BoxStream<'a, Result<Page<T>>>;

/// A stream of a listing's items, fetched page by page as they are read.
/// Dropping it stops the listing; an error ends it.
pub type Items<'a, T> = BoxStream<'a, Result<T>>;

/// The items of `pages`, one by one, then the error that ended them, if any.
pub(crate) fn items<'a, T: Send + 'a>(pages: Pages<'a, T>) -> Items<'a, T> {
    use futures::future::Either;
    pages
        .flat_map(|page| match page {
            Ok(page) => Either::Left(futures::stream::iter(page.items.into_iter().map(Ok))),
            Err(e) => Either::Right(futures::stream::once(async { Err(e) })),
        })
        .boxed()
}

/// What one request of a listing brought back.
pub(crate) struct Fetched<T> {
    pub(crate) items: Vec<T>,
    /// Where the server says the page starts.
    pub(crate) offset: u64,
    pub(crate) total: Option<u64>,
    /// The cursor of the next page, if one follows.
    pub(crate) next: Option<u64>,
}

/// Fetches a page given its cursor (an offset or a page number).
pub(crate) type FetchFn<'a, T> =
    Box<dyn FnMut(u64) -> BoxFuture<'a, Result<Fetched<T>>> + Send + 'a>;

struct State<'a, T, K> {
    operation: &'static str,
    cursor: Option<u64>,
    fetch: FetchFn<'a, T>,
    key: fn(&T) -> K,
    seen: HashSet<K>,
    max_items: usize,
}

/// The pages of a listing starting at cursor `first`. Each cursor must be
/// larger than the one before; every page must bring a new item; at most
/// `max_items` items are delivered.
pub(crate) fn paginate<'a, T, K>(
    operation: &'static str,
    first: u64,
    max_items: usize,
    key: fn(&T) -> K,
    fetch: FetchFn<'a, T>,
) -> Pages<'a, T>
where
    T: Send + 'a,
    K: Eq + Hash + Send + 'a,
{
    let state = State {
        operation,
        cursor: Some(first),
        fetch,
        key,
        seen: HashSet::new(),
        max_items,
    };
    futures::stream::try_unfold(state, |mut st| async move {
        let Some(cursor) = st.cursor else {
            return Ok(None);
        };
        let fetched = (st.fetch)(cursor).await?;
        let received = fetched.items.len();
        let key = st.key;
        let items: Vec<T> = fetched
            .items
            .into_iter()
            .filter(|item| st.seen.insert(key(item)))
            .collect();
        if received > 0 && items.is_empty() {
            return Err(paging(
                st.operation,
                format!("the server sent the page at {cursor} again (only items already listed)"),
            ));
        }
        if st.seen.len() > st.max_items {
            return Err(paging(
                st.operation,
                format!(
                    "the listing holds more than {} items (raise max_items, or read pages())",
                    st.max_items
                ),
            ));
        }
        let next = if received == 0 { None } else { fetched.next };
        if let Some(n) = next
            && n <= cursor
        {
            return Err(paging(
                st.operation,
                format!("the server pointed back from {cursor} to {n}"),
            ));
        }
        st.cursor = next;
        let page = Page {
            items,
            offset: fetched.offset,
            total: fetched.total,
            has_more: next.is_some(),
        };
        Ok(Some((page, st)))
    })
    .boxed()
}

/// Every item of a listing, in order.
pub(crate) async fn collect<T>(mut pages: Pages<'_, T>) -> Result<Vec<T>> {
    let mut out = Vec::new();
    while let Some(page) = pages.next().await {
        out.extend(page?.items);
    }
    Ok(out)
}

pub(crate) fn paging(operation: &'static str, message: String) -> Error {
    Error::Paging { operation, message }
}

/// A server number as a position: negative is a broken answer.
pub(crate) fn position(operation: &'static str, what: &str, value: i64) -> Result<u64> {
    u64::try_from(value).map_err(|_| paging(operation, format!("the server sent {what} {value}")))
}

/// A page size as the API takes it.
pub(crate) fn page_size(operation: &'static str, n: u64, max: u64) -> Result<u64> {
    if (1..=max).contains(&n) {
        Ok(n)
    } else {
        Err(Error::InvalidRequest(format!(
            "{operation}: page size {n} is outside 1..={max}"
        )))
    }
}

/// Which tree a file listing reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tree {
    Sources,
    Knowledge,
}

/// A listing of one directory of a context's source files or curated
/// knowledge: `.await` it for every entry, or read [`ListFiles::pages`].
///
/// Get one from [`Sources::list`](super::Sources::list) or
/// [`Knowledge::list`](super::Knowledge::list).
///
/// ```no_run
/// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
/// for entry in client.sources("docs").list().path("uploads").await? {
///     println!("{} {} {}", entry.kind, entry.name, entry.size);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a listing does nothing until awaited or read with pages()"]
pub struct ListFiles<'c> {
    client: &'c crate::Client,
    tree: Tree,
    slug: String,
    path: Option<String>,
    page_size: u64,
    max_items: usize,
}

/// The API's page size bound for file listings.
const FILES_MAX_PAGE: u64 = 1000;

impl<'c> ListFiles<'c> {
    pub(crate) fn new(client: &'c crate::Client, tree: Tree, slug: &str) -> Self {
        ListFiles {
            client,
            tree,
            slug: slug.to_owned(),
            path: None,
            page_size: DEFAULT_PAGE_SIZE,
            max_items: DEFAULT_MAX_ITEMS,
        }
    }

    /// The directory to list (default: the root).
    pub fn path(mut self, path: impl Into<String>) -> Self {
        let path = path.into();
        self.path = Some(path).filter(|p| !p.trim_matches('/').is_empty());
        self
    }

    paging_bounds!("Entries", "entries");

    fn operation(&self) -> &'static str {
        match (self.tree, self.path.is_some()) {
            (Tree::Sources, false) => "list_source_files",
            (Tree::Sources, true) => "list_source_files_by_path",
            (Tree::Knowledge, false) => "list_knowledge",
            (Tree::Knowledge, true) => "list_knowledge_by_path",
        }
    }

    /// The listing as a stream of pages, fetched as they are read.
    ///
    /// # Errors
    /// Each item is a page or the error that ended the listing: any
    /// [`Error`] of the calls, [`Error::Paging`] for pages that do not add
    /// up, [`Error::InvalidRequest`] for a page size out of range.
    pub fn pages(self) -> Pages<'c, crate::types::DirListingEntriesItem> {
        let op = self.operation();
        let limit = match page_size(op, self.page_size, FILES_MAX_PAGE) {
            Ok(n) => n,
            Err(e) => return futures::stream::once(async { Err(e) }).boxed(),
        };
        let ListFiles {
            client,
            tree,
            slug,
            path,
            max_items,
            ..
        } = self;
        let fetch: FetchFn<'c, crate::types::DirListingEntriesItem> =
            Box::new(move |offset: u64| {
                let slug = slug.clone();
                let path = path.clone();
                Box::pin(async move {
                    let api = client.api();
                    let limit_i = i64::try_from(limit).unwrap_or(i64::MAX);
                    let offset_i = i64::try_from(offset).unwrap_or(i64::MAX);
                    let (limit, offset_q) = (Some(limit_i), Some(offset_i));
                    let listed = match (tree, path.as_deref()) {
                        (Tree::Sources, None) => {
                            api.list_source_files(&slug, limit, offset_q).boxed()
                        }
                        (Tree::Sources, Some(p)) => api
                            .list_source_files_by_path(&slug, p, limit, offset_q)
                            .boxed(),
                        (Tree::Knowledge, None) => {
                            api.list_knowledge(&slug, limit, offset_q).boxed()
                        }
                        (Tree::Knowledge, Some(p)) => api
                            .list_knowledge_by_path(&slug, p, limit, offset_q)
                            .boxed(),
                    };
                    let listing = client.call(op, listed).await?;
                    dir_page(op, offset, listing)
                })
            });
        paginate(op, 0, max_items, |e| e.name.clone(), fetch)
    }
}

/// Checks a directory page against the offset asked for and finds the next one.
fn dir_page(
    op: &'static str,
    asked: u64,
    listing: crate::types::DirListing,
) -> Result<Fetched<crate::types::DirListingEntriesItem>> {
    let offset = position(op, "offset", listing.offset)?;
    if offset != asked {
        return Err(paging(
            op,
            format!("asked for offset {asked}, the server answered offset {offset}"),
        ));
    }
    let total = position(op, "total", listing.total)?;
    let len = listing.entries.len() as u64;
    let end = offset.saturating_add(len);
    let next = match listing.next_offset {
        Some(n) => Some(position(op, "next_offset", n)?),
        // A server that leaves `next_offset` out: the total tells.
        None if end < total => Some(end),
        None => None,
    };
    Ok(Fetched {
        items: listing.entries,
        offset,
        total: Some(total),
        next,
    })
}

items_and_await!(
    ListFiles,
    crate::types::DirListingEntriesItem,
    /// The entries one by one, each page fetched when the one before is
    /// read; the errors of [`ListFiles::pages`] end it.
    ///
    /// ```no_run
    /// # async fn run(client: nexus_knowql::Client) -> nexus_knowql::Result<()> {
    /// use futures::TryStreamExt;
    /// let mut entries = client.knowledge("docs").list().items();
    /// while let Some(entry) = entries.try_next().await? {
    ///     if entry.name.ends_with(".md") {
    ///         println!("first page of notes: {}", entry.name);
    ///         break; // no further page is fetched
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
);

#[cfg(test)]
mod tests {
    use super::*;

    fn pages_of(script: Vec<(Vec<u32>, Option<u64>)>, max_items: usize) -> Pages<'static, u32> {
        let mut script = script.into_iter();
        let fetch: FetchFn<'static, u32> = Box::new(move |offset| {
            let (items, next) = script.next().unwrap_or_default();
            Box::pin(async move {
                Ok(Fetched {
                    items,
                    offset,
                    total: None,
                    next,
                })
            })
        });
        paginate("test", 0, max_items, |i| *i, fetch)
    }

    /// Every item of the scripted pages, bounded by `max_items`.
    async fn collected(script: Vec<(Vec<u32>, Option<u64>)>, max_items: usize) -> Result<Vec<u32>> {
        collect(pages_of(script, max_items)).await
    }

    #[tokio::test]
    async fn follows_cursors_to_the_end() {
        let all = collected(
            vec![
                (vec![1, 2], Some(2)),
                (vec![3, 4], Some(4)),
                (vec![5], None),
            ],
            100,
        )
        .await
        .unwrap();
        assert_eq!(all, [1, 2, 3, 4, 5]);
    }

    #[tokio::test]
    async fn a_repeated_cursor_is_an_error() {
        let err = collected(vec![(vec![1, 2], Some(2)), (vec![3, 4], Some(2))], 100)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Paging { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn a_repeated_page_is_an_error_and_duplicates_are_dropped() {
        let err = collected(vec![(vec![1, 2], Some(2)), (vec![1, 2], Some(4))], 100)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("again"), "{err}");
        let all = collected(vec![(vec![1, 2], Some(2)), (vec![2, 3], None)], 100)
            .await
            .unwrap();
        assert_eq!(all, [1, 2, 3]);
    }

    #[tokio::test]
    async fn the_item_bound_is_an_error_not_a_truncation() {
        let err = collected(vec![(vec![1, 2], Some(2)), (vec![3, 4], None)], 3)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("more than 3"), "{err}");
    }

    #[tokio::test]
    async fn an_empty_page_ends_the_listing() {
        let all = collected(vec![(vec![1], Some(1)), (vec![], Some(5))], 10)
            .await
            .unwrap();
        assert_eq!(all, [1]);
    }
}
