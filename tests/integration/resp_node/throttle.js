// ioredis against sluiced's Redis protocol front: CL.THROTTLE,
// SLUICE.ACQUIRE and a pipeline, printed as one JSON line for resp_test.py.
// Usage: node throttle.js PORT
import Redis from "ioredis";

const redis = new Redis({ port: Number(process.argv[2]), host: "127.0.0.1", lazyConnect: true,
                          maxRetriesPerRequest: 0 });
await redis.connect();
const throttle = [];
for (let i = 0; i < 4; i++) throttle.push(await redis.call("CL.THROTTLE", "node", 2, 10, 60));
const acquire = await redis.call("SLUICE.ACQUIRE", "api", "node", 1);
const pipeline = redis.pipeline();
for (let i = 0; i < 50; i++) {
  pipeline.echo(`m${i}`);
  pipeline.call("SLUICE.PEEK", "api", "node");
}
const piped = (await pipeline.exec()).map(([error, value]) => (error ? String(error) : value));
let unknown = null;
try {
  await redis.call("GET", "x");
} catch (error) {
  unknown = String(error.message);
}
console.log(JSON.stringify({ throttle, acquire, piped, unknown }));
redis.disconnect();
