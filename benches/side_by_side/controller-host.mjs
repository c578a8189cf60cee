// Loaded into the TypeScript server with `node --import`: sends the Pinecone
// SDK's control-plane requests (https://api.pinecone.io) to
// PINECONE_CONTROLLER_HOST, the fake. That server hands the SDK a
// configuration object, and the SDK then reads no controller host from the
// environment. Index hosts come from the fake's describe-index answer, so
// data-plane requests go to the fake untouched.
const fake = process.env.PINECONE_CONTROLLER_HOST;
const controlPlane = 'https://api.pinecone.io';
if (fake) {
  const fetch = globalThis.fetch;
  globalThis.fetch = (input, init) => {
    const url = typeof input === 'string' || input instanceof URL ? String(input) : null;
    return url !== null && url.startsWith(controlPlane)
      ? fetch(fake + url.slice(controlPlane.length), init)
      : fetch(input, init);
  };
}
