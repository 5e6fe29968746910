// Compiled with `tsc --noEmit --strict` against the installed package by packaging/test.sh: the
// published .d.ts files must describe the API as the tests use it.
import { Client, BadRequest, ApiError, type Receipt, type StreamWriter, findClarionBinary } from 'clarion';
import { startServer, type ClarionServer } from 'clarion/testing';
import { platformKey } from 'clarion/binary';
import { unsupportedPlatform } from 'clarion/binary';

async function main(): Promise<void> {
  const server: ClarionServer = await startServer({ args: ['--api-key', 'k'] });
  const client = new Client({ baseUrl: server.apiUrl, apiKey: 'k', timeoutMs: 5000 });
  const r: Receipt = await client.publish('news', 'hello', { event: 'e' });
  const rs: Receipt[] = await client.publishBatch([['a', new Uint8Array([1])], { topic: 'b', data: 'x' }]);
  const answer: StreamWriter = await client.openStream('ai', 'Hel');
  const frag: Receipt = await answer.append('lo', { idempotencyKey: 'k1' });
  const last: Receipt = await answer.close('!');
  console.log(frag.seq, last.done, answer.id, answer.seq);
  try {
    await client.publish('bad topic', 'x');
  } catch (e) {
    if (e instanceof BadRequest) {
      const status: number = e.status;
      console.log(status, e.serverMessage);
    } else if (e instanceof ApiError) {
      console.log(e.body);
    }
  }
  const tokenClient = new Client({ token: async () => 'jwt' });
  console.log(unsupportedPlatform('x').message, r.id, rs.length, findClarionBinary(), platformKey(), await tokenClient.healthy(), server.wsUrl('news'));
  await server.stop();
}

void main();
