/* fencectl.c — runs a command while holding a fencegate lock (being written). */
int main(void)
{
    return 2;
}
